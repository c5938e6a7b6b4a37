"""The engines' own environments (``.venv-engines/ENGINE-VERSION``) and their dumper.

``scripts/test-deps.sh`` (``make test``) builds the SGLang and sglang-router environments
before pytest runs; the session fixtures here build them too when they are missing
(``scripts/engines/manifest.py install``, about a minute), so ``pytest tests/engines`` works
on a fresh clone. Only when pip cannot reach the package registry do they skip, and
``AUTOTUNE_REQUIRE_ENGINES=1`` (set by ``make test``) turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINES_DIR = ROOT / ".venv-engines"
MANIFEST_SCRIPT = ROOT / "scripts" / "engines" / "manifest.py"
DUMPER = ROOT / "scripts" / "engines" / "dump_parser.py"
REQUIRE_ENV = "AUTOTUNE_REQUIRE_ENGINES"

SGLANG = ("sglang", "0.5.23")
ROUTER = ("sglang-router", "0.3.2")
"""The pinned releases ``make test`` always checks (their environments are built)."""

BUILD_TIMEOUT_S = 1200
DUMPER_TIMEOUT_S = 300
BUILD_MODEL = ROOT / "scripts" / "build_model.py"
MODEL_BUILD_TIMEOUT_S = 300


def engines_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def venv_dir(engine: str, version: str) -> Path:
    return ENGINES_DIR / f"{engine}-{version}"


def built_python(engine: str, version: str) -> Path | None:
    """The environment's python when it was built completely (the stamp is written last)."""
    target = venv_dir(engine, version)
    python = target / "bin" / "python"
    return python if python.exists() and (target / ".autotune-engine").exists() else None


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Held by one process at a time, across xdist workers (an flock on ``lock_file``)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_lock(target: Path) -> contextlib.AbstractContextManager[None]:
    """One build per environment at a time (test-deps.sh takes the same lock with flock)."""
    return _exclusive(target.parent / f"{target.name}.lock")


def one_vllm_cpu_at_a_time() -> contextlib.AbstractContextManager[None]:
    """The real-vLLM tests' studies take turns (the study of test_vllm_real.py, the imported
    command of tests/init): vllm-cpu spreads its OpenMP threads over every core, so two servers
    on 2 cores slowed each 3x (the import test's two trials: 145 s alone, 495 s beside the
    other in a clean-clone run), and the other workers' tests with them."""
    return _exclusive(ENGINES_DIR / ".vllm-cpu-serving.lock")


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _registry_unreachable(requirement: str) -> str | None:
    """Why pip cannot reach the registry for ``requirement`` (its own words), or ``None``
    when it can (then a failed build is a real failure, not a missing network)."""
    name = requirement.split("==")[0]
    probe = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "index",
            "versions",
            name,
            "--timeout",
            "15",
            "--retries",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode == 0:
        return None
    said = [ln.strip() for ln in (probe.stderr + probe.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in said if "error" in ln.lower()] or said[-1:]
    return f"pip cannot reach the package registry for {name}: " + " / ".join(errors[-2:])


def _engine_requirement(engine: str, version: str) -> str:
    """The engine's own requirement in manifest.py's recipe (``sglang==0.5.23``)."""
    spec = importlib.util.spec_from_file_location("_autotune_engine_manifest", MANIFEST_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while defining Recipe
    spec.loader.exec_module(module)
    recipe = module.RECIPES.get((engine, version))
    if recipe is None:
        return engine
    return str((*recipe.no_deps, *recipe.deps, engine)[0])


def ensure_engine(engine: str, version: str) -> Path:
    """The engine environment's python, built with manifest.py install when missing.

    Skips (fails under ``AUTOTUNE_REQUIRE_ENGINES=1``) only when pip cannot reach the
    registry; any other build failure fails with pip's output.
    """
    target = venv_dir(engine, version)
    with _build_lock(target):
        # Always run install: it returns at once when the stamp matches the recipe and
        # rebuilds when the recipe changed.
        proc = subprocess.run(
            [
                sys.executable,
                str(MANIFEST_SCRIPT),
                "install",
                engine,
                version,
                "--venv",
                str(target),
            ],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            cwd=ROOT,
        )
    python = target / "bin" / "python"
    if proc.returncode == 0 and python.exists():
        return python
    log = _tail(proc.stdout + "\n" + proc.stderr)
    unreachable = _registry_unreachable(_engine_requirement(engine, version))
    if unreachable is None:
        pytest.fail(
            f"building the {engine} {version} environment at {target} failed "
            f"(the registry is reachable):\n{log}",
            pytrace=False,
        )
    if engines_required():
        pytest.fail(f"{REQUIRE_ENV} is set but {unreachable}\n{log}", pytrace=False)
    pytest.skip(f"{engine} {version} environment not built: {unreachable}")


def build_model(python: Path, out: Path) -> None:
    """``PYTHON scripts/build_model.py --out OUT`` (the tiny preset; it returns at once when the
    model is there), one build at a time: the real-engine tests of vLLM and transformers serve
    build the same directory from parallel xdist workers, and two builds at once remove each
    other's half-written files."""
    with _exclusive(out.parent / f".{out.name}.tests.lock"):
        proc = subprocess.run(
            [str(python), str(BUILD_MODEL), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=MODEL_BUILD_TIMEOUT_S,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"building the model at {out} with {python} failed:\n{_tail(proc.stderr, 40)}",
            pytrace=False,
        )


def run_dumper(python: Path, mode: str, engine: str, payload: Any = None) -> Any:
    """``ENGINE_PY dump_parser.py MODE ENGINE`` (``payload`` as JSON on stdin); its JSON."""
    with tempfile.TemporaryFile("w+") as stdin:
        if payload is not None:
            json.dump(payload, stdin)
            stdin.seek(0)
        proc = subprocess.run(
            [str(python), "-W", "ignore", str(DUMPER), mode, engine],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=DUMPER_TIMEOUT_S,
            cwd=ROOT,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"{python} dump_parser.py {mode} {engine} exited {proc.returncode}:\n"
            f"{_tail(proc.stderr, 40)}",
            pytrace=False,
        )
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """python of .venv-engines/sglang-0.5.23 (built if missing)."""
    return ensure_engine(*SGLANG)


@pytest.fixture(scope="session")
def router_python() -> Path:
    """python of .venv-engines/sglang-router-0.3.2 (built if missing)."""
    return ensure_engine(*ROUTER)


class EngineEnvs:
    """What the test modules use (fixtures cannot be imported): see the functions above."""

    required = staticmethod(engines_required)
    venv_dir = staticmethod(venv_dir)
    built_python = staticmethod(built_python)
    ensure = staticmethod(ensure_engine)
    run_dumper = staticmethod(run_dumper)
    build_model = staticmethod(build_model)


@pytest.fixture(scope="session")
def engine_envs() -> EngineEnvs:
    return EngineEnvs()
