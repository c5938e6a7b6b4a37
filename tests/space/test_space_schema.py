"""The JSON schema file is generated from the pydantic model and kept up to date."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from space_fixtures import BUNDLED, ROOT, VLLM

from autotune.space.schema import SCHEMA_PATH, main, render_schema, search_space_schema


def test_schema_file_is_up_to_date() -> None:
    assert SCHEMA_PATH == ROOT / "autotune" / "schemas" / "search_space.schema.json"
    assert SCHEMA_PATH.read_text(encoding="utf-8") == render_schema(), (
        "stale schema: run `python -m autotune.space.schema`"
    )
    assert main(["--check"]) == 0


def test_check_detects_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    assert main(["--check", "--output", str(stale)]) == 1
    assert main(["--output", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == render_schema()


def test_module_entry_point_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = subprocess.run(
        [sys.executable, "-m", "autotune.space.schema", "--output", str(out)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text(encoding="utf-8")) == search_space_schema()


def test_schema_shape() -> None:
    schema = search_space_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert set(schema["required"]) == {"name", "services", "parameters"}
    assert schema["additionalProperties"] is False
    params = schema["properties"]["parameters"]
    kinds = {ref["$ref"].rsplit("/", 1)[1] for ref in params["additionalProperties"]["oneOf"]}
    assert kinds == {"CategoricalParam", "IntParam", "FloatParam", "BoolParam", "DerivedParam"}
    assert params["propertyNames"]["pattern"] == "^[A-Za-z_][A-Za-z0-9_]*$"


@pytest.mark.parametrize("path", [BUNDLED, VLLM], ids=lambda p: p.name)
def test_bundled_files_validate_against_the_schema(path: Path) -> None:
    if importlib.util.find_spec("jsonschema") is None:
        pytest.skip(
            "jsonschema is not installed in .venv (not a project dependency); the schema is "
            "still checked for freshness above and the file by load_space elsewhere"
        )
    import jsonschema

    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    jsonschema.validate(document, search_space_schema())
    broken = {**document, "parameters": {"x": {"type": "enum"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, search_space_schema())
