"""Each committed manifest is what its engine's real parser says today.

``autotune/engines/manifests/ENGINE-VERSION.json`` is generated, never edited: for each one
whose engine environment exists (``.venv-engines/ENGINE-VERSION``; those in ``ALWAYS`` are
built by ``make test`` and by the fixtures, the others only when someone built them with
``scripts/engines/manifest.py install``), the test
dumps the parser again and compares, ``generated_by`` aside. On a mismatch it lists the
options added, removed and changed; regenerate with
``python3 scripts/engines/manifest.py generate ENGINE VERSION --venv .venv-engines/ENGINE-VERSION``.

Two things in a dump are not the parser's and are normalised on both sides:

* ``repr`` of a callable default names its memory address (``<function Envs.<lambda> at
  0x7f...>``), different in every process;
* argparse keeps ``choices`` in the order given, and sglang-router builds some of those lists
  from a set, whose order changes with ``PYTHONHASHSEED``; the order only shows in ``--help``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "autotune" / "engines" / "manifests").glob("*.json"))
ALWAYS = {
    ("sglang", "0.5.23"),
    ("sglang-router", "0.3.2"),
    ("transformers-serve", "5.17.0"),
    ("vllm", "0.26.0"),
    ("vllm", "0.32.0"),
    ("vllm", "0.33.0"),
}
"""Built when missing (session fixtures); the others are checked when their venv exists."""
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
MAX_LISTED = 40


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return _ADDRESS.sub(" at 0x...", value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        out = {k: _normalise(v) for k, v in value.items() if k != "generated_by"}
        if isinstance(out.get("choices"), list):
            out["choices"] = sorted(out["choices"], key=lambda c: json.dumps(c, sort_keys=True))
        return out
    return value


def _committed(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs, option by option (keyed by the first spelling) and variable by
    variable, then the remaining top-level fields."""
    lines: list[str] = []

    def keyed(items: list[dict[str, Any]] | None, key: Any) -> dict[str, dict[str, Any]]:
        return {key(item): item for item in items or []}

    for what, key in (
        ("options", lambda o: o["flags"][0] if o.get("flags") else o.get("dest", "?")),
        ("env", lambda e: e.get("name", "?")),
    ):
        start = len(lines)
        before, after = keyed(old.get(what), key), keyed(new.get(what), key)
        for name in sorted(after.keys() - before.keys()):
            lines.append(f"{what}: added {name}")
        for name in sorted(before.keys() - after.keys()):
            lines.append(f"{what}: removed {name}")
        for name in sorted(before.keys() & after.keys()):
            a, b = before[name], after[name]
            for field in sorted(a.keys() | b.keys()):
                if a.get(field) != b.get(field):
                    lines.append(
                        f"{what}: changed {name}.{field}: {a.get(field)!r} -> {b.get(field)!r}"
                    )
        if len(lines) == start and old.get(what) != new.get(what):
            lines.append(f"{what}: same entries, different order")
    for field in sorted((old.keys() | new.keys()) - {"options", "env"}):
        if old.get(field) != new.get(field):
            lines.append(f"{field}: {old.get(field)!r} -> {new.get(field)!r}")
    return lines


def _id(path: Path) -> str:
    return path.stem


@pytest.mark.parametrize("manifest", MANIFESTS, ids=_id)
def test_manifest_matches_real_parser(manifest: Path, engine_envs: Any) -> None:
    committed = _committed(manifest)
    engine, version = str(committed["engine"]), str(committed["version"])
    assert manifest.name == f"{engine}-{version}.json", manifest
    if (engine, version) in ALWAYS:
        python = engine_envs.ensure(engine, version)
    else:
        python = engine_envs.built_python(engine, version)
        if python is None:
            pytest.skip(
                f"no {engine} {version} environment at "
                f"{engine_envs.venv_dir(engine, version).relative_to(ROOT)} (build it with "
                f"python3 scripts/engines/manifest.py install {engine} {version} --venv "
                f"{engine_envs.venv_dir(engine, version).relative_to(ROOT)})"
            )
    dumped = engine_envs.run_dumper(python, "dump", engine)
    old, new = _normalise(committed), _normalise(dumped)
    if old == new:
        return
    changes = _changes(old, new)
    shown = changes[:MAX_LISTED]
    more = len(changes) - len(shown)
    pytest.fail(
        f"{manifest.relative_to(ROOT)} differs from what {engine} {version}'s parser dumps "
        f"now ({len(changes)} difference(s); committed -> dumped):\n  "
        + "\n  ".join(shown)
        + (f"\n  ... and {more} more" if more else "")
        + f"\nregenerate: python3 scripts/engines/manifest.py generate {engine} {version} "
        f"--venv {engine_envs.venv_dir(engine, version).relative_to(ROOT)}",
        pytrace=False,
    )
