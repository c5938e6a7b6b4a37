"""Which engine a command runs, and which release: from its program, or a running server.

The program tells the engine (``python -m sglang.launch_server``, ``vllm serve``, ...: each
engine's ``programs``, plus the spellings below that a deployment uses but the engine module
does not list). A command line does not say its release; a running server does
(``--url``: SGLang's ``GET /server_info`` has ``version``, vLLM's ``GET /version``), else the
user names it (``--engine-version``), else the release autotune pins for that engine is used
and the output says so. A release without a committed manifest is an error that names the
ones there are: its options would otherwise be checked against another release's parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from autotune.engines import ENGINES, BaseEngine, available_manifests, get_engine
from autotune.errors import ConfigError

GENERIC = "generic"

EXTRA_PROGRAMS: dict[str, tuple[str, ...]] = {
    # transformers/cli/transformers.py is the `transformers` console script's module; the
    # bundled launchers run it as `python -m transformers.cli.transformers serve`.
    "transformers-serve": ("transformers.cli.transformers serve",),
    # sglang_router/cli.py (console scripts sglang-router, smg, amg; `python -m sglang_router`
    # runs the same main): `launch` runs launch_router with the rest of the arguments.
    "sglang-router": (
        "sglang-router launch",
        "smg launch",
        "amg launch",
        "sglang_router launch",
    ),
    # vllm/entrypoints/cli/main.py is what the `vllm` console script runs.
    "vllm": ("vllm.entrypoints.cli.main serve",),
}
"""Program spellings beyond each engine module's ``programs``."""


def _markers(name: str) -> tuple[str, ...]:
    return (*ENGINES[name].programs, *EXTRA_PROGRAMS.get(name, ()))


@dataclass(frozen=True)
class ProgramMatch:
    """Where an engine's program sits in an argv."""

    engine: str
    end: int
    """Index just past the marker (``serve`` of ``vllm serve``)."""
    words: int
    """How many words the marker has."""


def find_program(argv: Sequence[str]) -> ProgramMatch | None:
    """The engine whose program ``argv`` runs (after any wrapper), or ``None``."""
    names = [t.rsplit("/", 1)[-1] for t in argv]
    best: ProgramMatch | None = None
    for engine in ENGINES:
        for marker in _markers(engine):
            words = marker.split()
            for i in range(len(names) - len(words) + 1):
                if names[i : i + len(words)] == words:
                    found = ProgramMatch(engine, i + len(words), len(words))
                    if best is None or found.end - found.words < best.end - best.words:
                        best = found
                    break
    return best


def extra_program_end(engine: str, argv: Sequence[str]) -> int | None:
    found = find_program(argv)
    return found.end if found is not None and found.engine == engine else None


@dataclass(frozen=True)
class ServerReport:
    """What a running server says about itself."""

    engine: str
    version: str | None
    url: str
    info: dict[str, Any]


def probe_server(url: str, *, timeout_s: float = 10.0) -> ServerReport:
    """Ask a running server which engine and release it is: SGLang's ``/server_info``
    (``/get_server_info`` on older releases), vLLM's ``/version``."""
    base = url.rstrip("/")
    tried: list[str] = []
    with httpx.Client(timeout=timeout_s) as client:
        for path, engine in (
            ("/server_info", "sglang"),
            ("/get_server_info", "sglang"),
            ("/version", "vllm"),
        ):
            try:
                answer = client.get(base + path)
            except httpx.HTTPError as exc:
                raise ConfigError(
                    f"cannot reach {base}: {exc.__class__.__name__}: {exc}", field="--url"
                ) from None
            tried.append(f"{path} {answer.status_code}")
            if answer.status_code != 200:
                continue
            try:
                payload = answer.json()
            except ValueError:
                continue
            if not isinstance(payload, dict):
                continue
            version = payload.get("version")
            if engine == "vllm" and set(payload) - {"version"}:
                continue  # not vLLM's {"version": "..."}
            if engine == "sglang" and ("vllm_config" in payload or "model_path" not in payload):
                continue  # vLLM's own /server_info (VLLM_SERVER_DEV_MODE=1) is not SGLang's
            return ServerReport(engine, str(version) if version else None, base, payload)
    raise ConfigError(
        f"{base} answers neither SGLang's /server_info nor vLLM's /version ({', '.join(tried)})",
        field="--url",
    )


def choose_engine(
    name: str,
    *,
    report: ServerReport | None,
    version: str | None,
    origin: str,
) -> tuple[BaseEngine, str]:
    """The engine at the release to check against, and a line saying how it was chosen."""
    if name == GENERIC:
        return get_engine(GENERIC), (
            f"{origin}: no engine autotune knows runs this program: the generic engine "
            "(flags kept as written, only their --long-name shape is checked)"
        )
    if report is not None and report.engine == name and report.version:
        chosen, how = report.version, f"reported by {report.url}"
    elif version is not None:
        chosen, how = version, "--engine-version"
    else:
        chosen = ENGINES[name].default_version or ""
        how = "the release autotune pins; --url or --engine-version names another"
    versions = available_manifests().get(name, ())
    if chosen not in versions:
        raise ConfigError(
            f"{origin}: {name} {chosen} ({how}) has no manifest, so its options cannot be read "
            f"with its own parser: generate one (python scripts/engines/manifest.py generate "
            f"{name} {chosen}) or give --engine-version with a release that has one",
            field="--engine-version",
            allowed=list(versions),
        )
    return get_engine(name, chosen), f"{origin}: {name} {chosen} ({how})"
