"""The SGLang router (PyPI ``sglang-router``, Rust), manifest from ``RouterArgs.add_cli_args``.

Checked as its own program: a deployment's router service runs
``python -m sglang_router.launch_router``; it forwards requests, so it has no request quirks
of its own and no version endpoint a worker's version could be confused with.
"""

from __future__ import annotations

from typing import ClassVar

from autotune.engines._base import BaseEngine, FailurePattern


class SGLangRouterEngine(BaseEngine):
    name: ClassVar[str] = "sglang-router"
    default_version: ClassVar[str | None] = "0.3.2"
    programs: ClassVar[tuple[str, ...]] = ("sglang_router.launch_router",)
    failure_patterns: ClassVar[tuple[FailurePattern, ...]] = (
        # src/observability/metrics.rs: its Prometheus exporter's port is taken.
        FailurePattern(
            76,
            "port_in_use",
            r"failed to install Prometheus metrics exporter.*Address already in use",
        ),
    )
