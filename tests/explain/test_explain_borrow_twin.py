"""``autotune explain --runs-from`` end to end on the twin: real simulated servers on
loopback, one SQLite file holding the tuning study and its check study.

The tuning study ``ex`` measures the baseline and one enqueued winner (three changes); the
check study ``ex-check`` (the same space, deployment and load, another name) measures both
again and re-measures each once from fresh starts. Its trial of the winner kept the router
of the trial before running (restart only what changed): not a fresh start, so not
borrowed. Explaining ``ex``'s winner with two runs per configuration and borrowing the
other three runs, the explanation measures the winner once and the three reverts twice (7
restarts instead of 10), and borrowing again adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_helpers import REPO, load
from test_explain_twin import cli

from autotune.explain import load_explanation, load_runs
from autotune.explain.record import Explanation

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
DEPLOYMENT = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
WINNER = (
    "{sm120_flashmla_backend: flashinfer, sm120_direct_swa_kv: true,"
    " cuda_graph_max_bs_decode: 32, pytorch_alloc_conf: 'expandable_segments:True'}"
)
REPEATS = ["--repeats", "2", "--max-repeats", "2", "--no-path", "--no-minimal"]


def _study_file(path: Path, name: str, remeasure: str, *, concurrency: int = 4) -> Path:
    path.write_text(
        f"name: {name}\nspace: {SPACE}\ndeployment: {DEPLOYMENT}\nobjective: throughput\n"
        f"load:\n  concurrency: {concurrency}\n  input_len: 64\n  output_len: 6\n"
        "  warmup_requests: 2\n  requests: 4\n  max_duration_s: 40\n  request_timeout_s: 40\n"
        f"correctness:\n  max_tokens: 3\nremeasure: {remeasure}\nenqueue:\n  - {WINNER}\n"
    )
    return path


@dataclass
class Borrowing:
    root: Path
    db: Path
    first: str
    result: Explanation
    runs_after_first: dict[str, list[tuple[int, str | None]]]
    again: str
    runs_after_again: dict[str, list[tuple[int, str | None]]]

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"


def _runs(db: Path) -> dict[str, list[tuple[int, str | None]]]:
    return {k: [(r.index, r.source) for r in rs] for k, rs in load_runs(load("ex", db)).items()}


@pytest.fixture(scope="module")
def borrowing(tmp_path_factory: pytest.TempPathFactory) -> Borrowing:
    root = tmp_path_factory.mktemp("borrow")
    db = root / "ex.db"
    url = f"sqlite:///{db}"
    ex = _study_file(root / "ex.yaml", "ex", "{budget: 0}")
    check = _study_file(root / "ex-check.yaml", "ex-check", "{policy: fixed, top_k: 2, repeats: 1}")
    for name, path in (("ex", ex), ("ex-check", check)):
        done = cli("run", "--trials", "2", "--study", name, "--storage", url,
                   "--study-file", str(path), cwd=root)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    common = ["--study", "ex", "--storage", url, "--study-file", str(ex), *REPEATS]
    borrow = ["--runs-from", "ex-check", "--runs-from-storage", url,
              "--runs-from-file", str(check)]  # fmt: skip
    first = cli("explain", *common, *borrow, cwd=root)
    assert first.returncode == 0, first.stdout + first.stderr
    result = load_explanation(load("ex", db))
    assert result is not None
    after_first = _runs(db)
    again = cli("explain", *common, *borrow, cwd=root)
    assert again.returncode == 0, again.stdout + again.stderr
    return Borrowing(root, db, first.stdout, result, after_first, again.stdout, _runs(db))


def test_the_check_studys_runs_stand_in_for_the_winners_and_the_baselines(
    borrowing: Borrowing,
) -> None:
    e = borrowing.result
    assert e.complete and e.winner == 1
    assert (
        "borrowed 3 measurement(s) of 2 configuration(s) from study 'ex-check' "
        "(not borrowed: 1 not from freshly started services)"
    ) in borrowing.first
    runs = borrowing.runs_after_first
    win, base = e.winner_measured.key, e.baseline_measured.key
    assert win is not None and base is not None
    assert runs[base] == [(0, "ex-check#0"), (1, "ex-check#0/1")]
    assert runs[win] == [(0, "ex-check#1/1"), (1, None)]  # one borrowed, one measured
    assert e.winner_measured.n == e.baseline_measured.n == 2
    # the explanation measured the winner once and the three reverts twice each
    own = [s for rs in runs.values() for _, s in rs if s is None]
    assert len(own) == 7 and e.runs == 7 and e.borrowed == 3
    assert len(e.effects) == 3 and all(x.without.n == 2 for x in e.effects)
    assert "done: 7 runs in" in borrowing.first
    assert "7 runs + 3 borrowed" in borrowing.first
    # only the winner holds runs of both kinds: the drift between occasions from it alone
    [occasion] = e.occasions
    assert occasion.study == "ex-check" and occasion.configurations == 1
    assert "runs lent by study 'ex-check' read " in borrowing.first


def test_borrowing_again_stores_nothing_twice_and_measures_nothing(borrowing: Borrowing) -> None:
    assert borrowing.runs_after_again == borrowing.runs_after_first
    assert "borrowed 0 measurement(s) of 0 configuration(s) from study 'ex-check'" in (
        borrowing.again
    )
    assert "done: 0 runs in" in borrowing.again


def test_a_study_measured_under_another_load_is_refused_naming_file_and_field(
    borrowing: Borrowing,
) -> None:
    other = _study_file(borrowing.root / "other.yaml", "ex-check", "{budget: 0}", concurrency=8)
    before = load("ex", borrowing.db).user_attrs
    done = cli("explain", "--study", "ex", "--storage", borrowing.url, "--study-file",
               str(borrowing.root / "ex.yaml"), *REPEATS, "--runs-from", "ex-check",
               "--runs-from-storage", borrowing.url, "--runs-from-file", str(other),
               cwd=borrowing.root)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{other}: field 'load': study 'ex-check' was measured under another load" in (
        done.stderr
    )
    assert load("ex", borrowing.db).user_attrs == before  # nothing stored, nothing measured


def test_a_study_cannot_borrow_its_own_trials(borrowing: Borrowing) -> None:
    ex = str(borrowing.root / "ex.yaml")
    done = cli("explain", "--study", "ex", "--storage", borrowing.url, "--study-file", ex,
               *REPEATS, "--runs-from", "ex", "--runs-from-storage", borrowing.url,
               "--runs-from-file", ex, cwd=borrowing.root)  # fmt: skip
    assert done.returncode == 2
    own = "cannot borrow its own trials as another study's: they chose the winner"
    assert own in done.stderr
    assert "--own-runs borrows its other configurations' runs (not the winner's)" in done.stderr


def test_where_to_borrow_from_without_what_is_an_error(borrowing: Borrowing) -> None:
    done = cli("explain", "--study", "ex", "--storage", borrowing.url, "--study-file",
               str(borrowing.root / "ex.yaml"), "--runs-from-storage", borrowing.url,
               cwd=borrowing.root)  # fmt: skip
    assert done.returncode == 2
    assert "field '--runs-from'" in done.stderr and "give --runs-from STUDY" in done.stderr


def test_the_report_and_show_count_the_borrowed_runs(borrowing: Borrowing) -> None:
    out = borrowing.root / "report.html"
    done = cli("report", "--study", "ex", "--storage", borrowing.url, "--out", str(out),
               cwd=borrowing.root)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 run(s) and 3 borrowed from another study, each from freshly started" in (
        out.read_text()
    )
    shown = cli("explain", "--study", "ex", "--storage", borrowing.url, "--show",
                cwd=borrowing.root)  # fmt: skip
    assert shown.returncode == 0 and "7 runs + 3 borrowed" in shown.stdout
