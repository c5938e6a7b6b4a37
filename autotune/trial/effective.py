"""Tuned values the servers silently overrode (from ``/server_info`` read by the launcher).

Servers silently rewrite settings (SGLang turns custom all-reduce off on PCIe with more than
two GPUs, forces page size 256 for DeepSeek-V4, ...). What was measured is the resolved
configuration, so it is stored with the trial and every tuned value the server overrode is
flagged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.engines import Manifest
from autotune.space.settings import ServiceSettings


def _normalize(value: Any) -> Any:
    if isinstance(value, (list, tuple)):  # several values (--cuda-graph-bs-decode 1 2 4)
        return tuple(_normalize(v) for v in value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return round(float(value), 6)
    text = str(value)
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return round(float(text), 6)
    except ValueError:
        return text


def find_overrides(
    settings: Mapping[str, ServiceSettings],
    effective: Mapping[str, Mapping[str, Any]],
    *,
    manifest: Manifest | None = None,
) -> list[str]:
    """Tuned flags whose resolved value differs from what was asked, one line each.

    A flag is looked up under the field its option stores into (the engine's manifest:
    ``--tp`` and ``--tensor-parallel-size`` are both ``tp_size``), else under its own name
    (``--mem-fraction-static`` as ``mem_fraction_static``); a switch asks for ``True`` when
    present and ``False`` when removed. Flags the server does not report are not judged.
    """
    overrides: list[str] = []
    for service, tuned in settings.items():
        resolved = effective.get(service)
        if not resolved:
            continue
        wanted: dict[str, Any] = {}
        for flag, value in tuned.flags.items():
            wanted[flag] = True if value is None else value
        for flag in tuned.remove_flags:
            wanted[flag] = False
        for flag, value in sorted(wanted.items()):
            option = manifest.option(flag) if manifest is not None else None
            key = option.dest if option is not None else flag.lstrip("-").replace("-", "_")
            if key not in resolved:
                continue
            if value is False and not isinstance(resolved[key], bool):
                # A removed value flag means "server default", which any value satisfies.
                continue
            if _normalize(resolved[key]) != _normalize(value):
                overrides.append(
                    f"{service}: {flag} asked {value!r}, server runs {resolved[key]!r}"
                )
    return overrides
