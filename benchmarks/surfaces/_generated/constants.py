"""The levels' settings (needle-fraction bands, lever counts, noise, numeric shapes), the
failure codes and one launch's result."""

from __future__ import annotations

import re
from dataclasses import dataclass

LEVELS = ("easy", "medium", "hard")
PRESETS = ("heldout",)
WITHIN = 0.95
"""A configuration within 5% of the optimum counts toward the needle fraction."""
BANDS: dict[str, tuple[float, float]] = {
    "easy": (0.01, 0.05),
    "medium": (0.001, 0.01),
    "hard": (0.00001, 0.001),
    "heldout": (0.001, 0.01),
}
"""Needle fraction each level is calibrated into (the test checks it)."""
TARGETS = {"easy": 0.022, "medium": 0.0025, "hard": 0.00008, "heldout": 0.0025}
ACCEPT: dict[str, tuple[float, float]] = {
    "easy": (0.013, 0.04),
    "medium": (0.0012, 0.008),
    "hard": (0.000025, 0.0005),
    "heldout": (0.0012, 0.008),
}
"""What a draw must reach to be kept (inside BANDS, so an upgrade stays near its band)."""
BASELINE_BAND = (0.02, 0.20)
"""The baseline's value as a share of the optimum."""
LEVER_COUNTS = {"easy": (5, 7), "medium": (7, 10), "hard": (9, 12), "heldout": (6, 6)}
NOISE = {  # base sigma, growth with batch, extra within 1.5 memory steps of the OOM edge
    "easy": (0.012, 0.5, 0.010),
    "medium": (0.020, 0.6, 0.015),
    "hard": (0.030, 0.6, 0.025),
    "heldout": (0.030, 0.0, 0.0),
}
SIGMA_RANGE = (0.01, 0.06)
K_RANGE = (0.2, 4.0)
"""Shape exponents calibration may pick (past 4, most of a lever's range is a plateau)."""
_EASY_NUM = {
    "t0": (0.75, 0.92),
    "tb": (0.1, 0.25),
    "k0": (0.35, 0.55),
    "k1": (1.0, 1.6),
    "us": (0.18, 0.3),
    "mg": (0.02, 0.06),
    "q": (0.5, 1.5),
    "acc": (0.05, 0.2),
}
NUM_SHAPE: dict[str, dict[str, tuple[float, float]]] = {  # ranges of the numeric block's shape
    "easy": _EASY_NUM,
    "medium": {
        "t0": (0.75, 0.92),
        "tb": (0.1, 0.25),
        "k0": (0.35, 0.55),
        "k1": (1.0, 1.6),
        "us": (0.18, 0.3),
        "mg": (0.03, 0.08),
        "q": (0.6, 1.6),
        "acc": (0.05, 0.25),
    },
    "hard": {
        "t0": (0.7, 0.9),
        "tb": (0.15, 0.3),
        "k0": (0.2, 0.4),
        "k1": (0.9, 1.4),
        "us": (0.25, 0.4),
        "mg": (0.08, 0.2),
        "q": (1.0, 2.5),
        "acc": (0.15, 0.5),
    },
    "heldout": _EASY_NUM,
}
NAME_RE = re.compile(r"^gen-(easy|medium|hard|heldout)-(\d+)((?:-up\d+)*)$")

OK, WRONG, CRASHED, OOM, FORBIDDEN = 0, 1, 2, 3, 4
FAILURES = {WRONG: "wrong_output", CRASHED: "crashed", OOM: "cuda_oom", FORBIDDEN: "forbidden"}


@dataclass(frozen=True)
class Result:
    """One launch: the score (tok/s), its per-token latency, or why it failed."""

    value: float = 0.0
    latency_ms: float | None = None
    failure: str | None = None
    reason: str = ""
