"""benchmarks/explain_borrow.py, a few seeds: the tables BENCHMARKS.md quotes come out of it,
and the two-machine replay says what the product pays and buys where the second GPU reads
apart from the first (the first GPU's runs left out, every configuration measured on the
second) and that nothing changes where it reads alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _rows(out: str, header: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_replay_tables() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "explain_borrow.py"), "--seeds", "12"],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    plans = _rows(out, "| explain settings |")
    ablation = [r for r in plans if r[0].startswith("--repeats 2 --no-path --no-minimal")]
    assert [r[2].split()[0] for r in ablation] == ["18", "15", "13"]
    drift = _rows(out, "| machine vs the check's |")
    assert [r[:2] for r in drift] == [
        ["+0.0%", "left out (the product)"], ["+0.0%", "kept"],
        ["-14.5%", "left out (the product)"], ["-14.5%", "kept"],
    ]  # fmt: skip
    assert drift[2][3] == "100%" and drift[3][3] == "0%"
    machines = _rows(out, "| second GPU vs the first (first: 6 runs) |")
    same, same_off, apart, apart_off = machines
    # alike: nothing changes, 13 restarts either way, the first GPU kept
    assert same[2:4] == same_off[2:4] == ["13 (13-13)", "0%"]
    # apart: the product leaves the first GPU out every time and measures again...
    assert apart[1] == "yes (the product)" and apart[3] == "100%"
    assert int(apart[2].split()[0]) > int(apart_off[2].split()[0])
    # ...and its interval is narrower than the pooled one, which the drift widened
    width = int(apart[5].replace(",", ""))
    assert width < int(apart_off[5].replace(",", ""))

    # its reading of fp8 on the second GPU: the truth there within half its interval
    bought, truth = apart[4].replace(",", "").replace("(", "").replace(")", "").split()
    assert abs(float(bought) - float(truth)) < width / 2
