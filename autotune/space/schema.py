"""The JSON schema of search-space files, generated from :mod:`autotune.space.model`.

``python -m autotune.space.schema`` rewrites ``autotune/schemas/search_space.schema.json``;
``--check`` exits 1 when the file is stale (a test does the same). Editors use it through
``# yaml-language-server: $schema=../autotune/schemas/search_space.schema.json``. The schema
checks shapes only; ``autotune space check`` checks everything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.space.model import SpaceFile

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "search_space.schema.json"
SCHEMA_ID = "urn:autotune:schemas:search_space"


def search_space_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of a search-space file."""
    schema = SpaceFile.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "autotune search space",
    }


def render_schema() -> str:
    """The schema file's exact text."""
    return json.dumps(search_space_schema(), indent=2, ensure_ascii=False) + "\n"


def write_schema(path: Path = SCHEMA_PATH) -> Path:
    """Write the schema to ``path`` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_schema(), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autotune.space.schema",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--output", type=Path, default=SCHEMA_PATH)
    args = parser.parse_args(argv)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != render_schema():
            print(f"{args.output} is stale; run python -m autotune.space.schema", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    print(write_schema(args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
