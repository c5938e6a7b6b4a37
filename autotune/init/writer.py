"""The three files ``autotune init`` writes, checked before any of them is in place.

``OUT/launchers/NAME.yaml`` (the deployment), ``OUT/search_spaces/NAME.yaml`` (the proposed
space) and ``OUT/studies/NAME.yaml`` (the study tying them, with the recipes enqueued), the
layout ``autotune run --study NAME`` finds from ``OUT``. Existing files are refused unless
``force``. Before anything is moved into place the files are loaded as autotune loads them
and checked twice:

* the baseline rendered on the deployment must give every service's command line and
  environment back, token for token (the promise that the baseline is what runs now);
* ``autotune space check``'s own check (:func:`autotune.dryrun.check_commands`): the
  baseline and sampled configurations rendered and read with each engine's parser.

Credentials are references (``${env:VAR}``): both checks render with a stand-in value for each,
so they run without the real ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.engines import EngineRef
from autotune.errors import ConfigError
from autotune.init.importer import Imported, LoadSettings
from autotune.init.options import REFERENCE
from autotune.pinned_env import PINNED_ENV

CHECK_SAMPLES = 200


@dataclass
class Written:
    """Where the files went, and what the space check said."""

    deployment: Path
    space: Path
    study: Path
    checked: int
    findings: list[str]


def paths(out: Path, name: str) -> tuple[Path, Path, Path]:
    return (
        out / "launchers" / f"{name}.yaml",
        out / "search_spaces" / f"{name}.yaml",
        out / "studies" / f"{name}.yaml",
    )


def space_dict(imported: Imported) -> dict[str, Any]:
    proposed = imported.proposed
    by_name = {s.name: s for s in imported.services}
    services = proposed.services
    engines = {
        n: EngineRef(name=by_name[n].engine.name, version=by_name[n].engine.version)
        for n in services
    }
    main = engines[services[0]]
    data: dict[str, Any] = {
        "name": imported.name,
        "description": (
            f"Levers proposed by `autotune init` for {imported.name} from the catalog of "
            + ", ".join(sorted({f"{e.name} {e.version or ''}".strip() for e in engines.values()}))
            + " (autotune/init/catalog/), around the values the deployment runs today."
        ),
        "services": services,
        "engine": main.model_dump(exclude_none=True),
    }
    others = {n: e.model_dump(exclude_none=True) for n, e in engines.items() if e != main}
    if others:
        data["service_engines"] = others
    data["parameters"] = proposed.params
    data["baseline"] = proposed.baseline
    return data


def study_dict(imported: Imported, load: LoadSettings) -> dict[str, Any]:
    return {
        "name": imported.name,
        "description": (
            f"Maximize output throughput of {imported.name} at concurrency {load.concurrency}, "
            "from the configuration it runs today (written by `autotune init`)."
        ),
        "space": f"../search_spaces/{imported.name}.yaml",
        "deployment": f"../launchers/{imported.name}.yaml",
        "objective": "throughput",
        "sampler": "tpe",
        "load": {
            "concurrency": load.concurrency,
            "input_len": load.input_len,
            "output_len": load.output_len,
            # Text prompts (lengths in words): random token ids (1000-30000) may lie outside
            # a small model's vocabulary, text never does.
            "prompt": "text",
            "warmup_requests": load.concurrency,
            "requests": load.requests,
            "max_duration_s": 300,
            "request_timeout_s": 120,
        },
        "trial_timeout_s": 1800,
    }


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)


def render_texts(imported: Imported, load: LoadSettings) -> tuple[str, str, str]:
    """The three files' text (with a header saying where each came from)."""
    origin = "; ".join(imported.sources)
    header = f"# Written by `autotune init` from: {origin}\n"
    deployment = (
        header
        + "# Commands as they run today; credentials are ${env:VAR} references, read from the\n"
        "# environment `autotune run` starts in. The search space adds its levers per trial.\n"
        + _dump(imported.deployment)
    )
    space = (
        header
        + "# Each lever cites its source (autotune/init/catalog/); the baseline is what runs\n"
        "# today.\n" + _dump(space_dict(imported))
    )
    study = header + _dump(study_dict(imported, load))
    if imported.proposed.enqueue:
        study += (
            "# The engines' published recipes for this model, tried right after the baseline:\n"
            "enqueue:\n"
        )
        for changes, recipe in imported.proposed.enqueue:
            study += f"  # {recipe.name}: {' '.join(recipe.says.split())}\n  # ({recipe.cite})\n"
            study += "  - " + yaml.safe_dump(changes, default_flow_style=True, width=1000)
    return deployment, space, study


def write(imported: Imported, out: Path, load: LoadSettings, *, force: bool) -> Written:
    """Write, check, then move the three files into ``out`` (see the module docstring)."""
    targets = paths(out, imported.name)
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise ConfigError(
            f"{', '.join(existing)} already exist: give --force to overwrite", field="--force"
        )
    for target in targets:
        if target.exists() and not target.is_file():
            raise ConfigError(f"{target} exists and is not a file", field="--out")
    texts = render_texts(imported, load)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".autotune-init-", dir=out) as tmp:
        staged = paths(Path(tmp), imported.name)
        for path, text in zip(staged, texts, strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        checked, findings = check(imported, staged)
        for source, target in zip(staged, targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(source), str(target))
    return Written(*targets, checked=checked, findings=findings)


@contextlib.contextmanager
def stand_in_secrets(imported: Imported) -> Iterator[dict[str, str]]:
    """Every ``${env:VAR}`` of the deployment set to a stand-in while checking."""
    names: set[str] = set()
    for service in imported.services:
        for text in [*service.argv(), *service.env.values()]:
            names |= {m[6:-1] for m in REFERENCE.findall(text)}
    values = {n: f"<{n}>" for n in names}  # never the real value, even when it is set
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update(values)
    try:
        yield values
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def check(imported: Imported, staged: tuple[Path, Path, Path]) -> tuple[int, list[str]]:
    """The staged files load, the baseline renders what runs today, the space check passes."""
    from autotune.deployment import load_deployment
    from autotune.dryrun import check_commands
    from autotune.render import render
    from autotune.space import load_space
    from autotune.study.definition import load_study_definition

    load_study_definition(staged[2])
    deployment = load_deployment(staged[0])
    space = load_space(staged[1])
    with stand_in_secrets(imported) as values:
        specs = render(space, deployment, space.baseline_config())
        for service in imported.services:
            spec = specs[service.name]
            want_argv = [_resolve(t, values) for t in service.argv()]
            want_env = {k: _resolve(v, values) for k, v in service.env.items()}
            want_env.update(PINNED_ENV)
            if list(spec.argv) != want_argv or spec.env != dict(sorted(want_env.items())):
                raise ConfigError(  # pragma: no cover - a bug of init, never the user's
                    f"internal check failed: the baseline of service {service.name} renders "
                    f"{list(spec.argv)} {spec.env}, not what runs today: {want_argv} {want_env}"
                )
        findings, checked, _ = check_commands(
            space, {str(staged[0]): deployment}, samples=CHECK_SAMPLES
        )
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise ConfigError(
            "the proposed space fails `autotune space check`: "
            + "; ".join(str(f) for f in errors[:3]),
        )
    return checked, [str(f) for f in findings]


def _resolve(text: str, values: dict[str, str]) -> str:
    return REFERENCE.sub(lambda m: values[m.group(0)[6:-1]], text)
