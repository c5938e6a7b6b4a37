"""The configuration the servers really run: ``/server_info`` after readiness.

Servers silently rewrite settings (SGLang turns custom all-reduce off on PCIe with more than
two GPUs, forces page size 256 for DeepSeek-V4, ...). What was measured is the resolved
configuration, so it is stored with the trial and every tuned value the server overrode is
flagged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from autotune.space.settings import ServiceSettings
from autotune.specs import ServiceSpec

INFO_TIMEOUT_S = 5.0


def fetch_effective(specs: Mapping[str, ServiceSpec]) -> dict[str, dict[str, Any]]:
    """Resolved server arguments per service that has an info URL (missing ones skipped).

    Tries the URL given, then SGLang's older ``/get_server_info`` spelling.
    """
    out: dict[str, dict[str, Any]] = {}
    with httpx.Client(timeout=INFO_TIMEOUT_S, trust_env=False) as client:
        for name, spec in specs.items():
            if not spec.info_url:
                continue
            urls = [spec.info_url]
            if spec.info_url.endswith("/server_info"):
                urls.append(spec.info_url[: -len("/server_info")] + "/get_server_info")
            for url in urls:
                try:
                    response = client.get(url)
                except httpx.HTTPError:
                    continue
                if response.status_code == 200:
                    try:
                        body = response.json()
                    except ValueError:
                        continue
                    if isinstance(body, dict):
                        out[name] = body
                        break
    return out


def _normalize(value: Any) -> Any:
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
    settings: Mapping[str, ServiceSettings], effective: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Tuned flags whose resolved value differs from what was asked, one line each.

    A flag ``--mem-fraction-static`` is looked up as ``mem_fraction_static``; a switch asks
    for ``True`` when present and ``False`` when removed. Flags the server does not report
    are not judged.
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
            key = flag.lstrip("-").replace("-", "_")
            if key not in resolved:
                continue
            if _normalize(resolved[key]) != _normalize(value):
                overrides.append(f"{service}: {flag} asked {value!r}, server runs {resolved[key]!r}")
    return overrides
