"""Shared data and helpers for the search-space tests (imported, not a conftest)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
VLLM = ROOT / "search_spaces" / "vllm-cpu.yaml"

SMALL: dict[str, Any] = {
    "name": "small",
    "services": ["prefill", "decode"],
    "parameters": {
        "proto": {
            "type": "categorical",
            "choices": ["unset", "LL"],
            "target": {"env": "NCCL_PROTO", "unset_value": "unset"},
        },
        "chan": {"type": "bool"},
        "nmin": {
            "type": "int",
            "low": 1,
            "high": 32,
            "log": True,
            "when": "chan",
            "target": {"env": "NCCL_MIN_NCHANNELS"},
        },
        "mem": {
            "type": "float",
            "low": 0.7,
            "high": 0.95,
            "step": 0.01,
            "target": {"flag": "--mem-fraction-static"},
        },
        "spec": {
            "type": "categorical",
            "choices": ["off", "eagle"],
            "services": ["decode"],
            "target": {
                "map": {"off": {}, "eagle": {"flags": {"--speculative-algorithm": "EAGLE"}}}
            },
        },
        "steps": {
            "type": "int",
            "low": 1,
            "high": 4,
            "when": "spec == 'eagle'",
            "services": ["decode"],
            "target": {"flag": "--speculative-num-steps"},
        },
        "draft": {
            "derived": "steps + 1",
            "services": ["decode"],
            "target": {"flag": "--speculative-num-draft-tokens"},
        },
    },
    "forbidden": [{"name": "too_many", "when": "nmin > 16", "reason": "illustrative"}],
    "baseline": {"proto": "unset", "chan": False, "mem": 0.88, "spec": "eagle", "steps": 3},
}


def small() -> dict[str, Any]:
    """A fresh deep copy of a small valid space (to be broken by a test)."""
    return copy.deepcopy(SMALL)


def write(path: Path, data: object) -> Path:
    """Write ``data`` as YAML (or verbatim when it is a string) and return the path."""
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path
