"""``autotune explain --own-runs`` end to end on the twin: real simulated servers on loopback,
the explained study lending its own fresh-start runs.

The study ``own`` measures the baseline, a winner of three changes (enqueued) and that winner
with its attention change reverted (enqueued; on the twin that change is most of the gain, so
the enqueued winner wins), and re-measures all three once from fresh starts. Explaining the
winner with two runs per configuration and ``--own-runs``, the study lends the earliest
fresh-start run of the baseline and of the revert (at most ``repeats - 1`` = 1 each) and
nothing of the winner's configuration (its trial and re-measurement chose it): the
explanation measures the winner twice, the baseline and that revert once each, the other two
reverts twice each (8 restarts instead of 10). Without the flag it borrows nothing.
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
REVERT = "{cuda_graph_max_bs_decode: 32, pytorch_alloc_conf: 'expandable_segments:True'}"
REPEATS = ["--repeats", "2", "--max-repeats", "2", "--no-path", "--no-minimal"]


@dataclass
class OwnRuns:
    root: Path
    db: Path
    out: str
    result: Explanation
    runs: dict[str, list[tuple[int, str | None]]]

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> OwnRuns:
    root = tmp_path_factory.mktemp("own")
    db = root / "own.db"
    url = f"sqlite:///{db}"
    path = root / "own.yaml"
    path.write_text(
        f"name: own\nspace: {SPACE}\ndeployment: {DEPLOYMENT}\nobjective: throughput\n"
        "load:\n  concurrency: 4\n  input_len: 64\n  output_len: 6\n"
        "  warmup_requests: 2\n  requests: 4\n  max_duration_s: 40\n  request_timeout_s: 40\n"
        "correctness:\n  max_tokens: 3\nremeasure: {policy: fixed, top_k: 3, repeats: 1}\n"
        f"enqueue:\n  - {WINNER}\n  - {REVERT}\n"
    )
    done = cli("run", "--trials", "3", "--study", "own", "--storage", url,
               "--study-file", str(path), cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    first = cli("explain", "--study", "own", "--storage", url, "--study-file", str(path),
                *REPEATS, "--own-runs", cwd=root)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    result = load_explanation(load("own", db))
    assert result is not None
    runs = {k: [(r.index, r.source) for r in rs] for k, rs in load_runs(load("own", db)).items()}
    return OwnRuns(root, db, first.stdout, result, runs)


def test_the_study_lends_its_other_configurations_runs_never_the_winners(own: OwnRuns) -> None:
    e = own.result
    assert e.complete and e.winner == 1 and len(e.effects) == 3
    win, base = e.winner_measured.key, e.baseline_measured.key
    assert win is not None and base is not None
    # the winner's configuration: every run is the explanation's own
    assert own.runs[win] == [(0, None), (1, None)]
    # the baseline (#0, the first trial: a fresh start): its first run lent, the second measured
    assert own.runs[base][:2] == [(0, "own#0"), (1, None)]
    lent = sorted(s for rs in own.runs.values() for _, s in rs if s is not None)
    # the revert (#2): its trial, or its re-measurement where the trial kept the router
    assert lent in (["own#0", "own#2"], ["own#0", "own#2/1"])
    assert all(x.without.n == 2 for x in e.effects)
    assert "from study 'own'" in own.out and "the winner's configuration" in own.out
    # the baseline and the revert hold a lent run and one of the explanation's own
    [occasion] = e.occasions
    assert occasion.study == "own" and occasion.configurations == 2
    assert "runs lent by study 'own' read " in own.out
    measured = [s for rs in own.runs.values() for _, s in rs if s is None]
    if occasion.left_out:
        # on a busy machine the study's trials and the explanation can read apart (the
        # drift between occasions): its runs left out, the two configurations measured here.
        # The decision is frozen; the interval over every run since may include 1 again.
        assert occasion.ratio is not None and "its runs are left out" in own.out
        assert len(measured) == 10 and e.runs == 10 and e.borrowed == e.borrowed_own == 0
        assert own.runs[base] == [(0, "own#0"), (1, None), (2, None)]
    else:
        assert not occasion.drift and "within the noise" in own.out
        assert len(measured) == 8 and e.runs == 8 and e.borrowed == e.borrowed_own == 2
        assert f"{e.runs} runs + {e.borrowed} borrowed ({e.borrowed_own} from its own trials)" in (
            own.out
        )


def test_the_report_says_the_runs_came_from_the_study_itself(own: OwnRuns) -> None:
    out = own.root / "report.html"
    done = cli("report", "--study", "own", "--storage", own.url, "--out", str(out),
               cwd=own.root)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    e = own.result
    html = out.read_text()
    assert "Runs lent by study &#x27;own&#x27; read " in html
    if e.occasions[0].left_out:  # read apart (a busy machine): no run of the study is used
        assert f"{e.runs} run(s), each from freshly started" in html
        assert "its runs are left out" in html
    else:
        assert (
            f"{e.runs} run(s) and {e.borrowed_own} borrowed from the study's own trials "
            "(not the winner's), each from freshly started"
        ) in html


def test_the_study_file_can_ask_for_it_and_the_flag_can_refuse_it(own: OwnRuns) -> None:
    """``explain.own_runs: true`` in the study file asks; ``--no-own-runs`` overrides it and
    borrows nothing more (what is stored stays)."""
    path = own.root / "own-file.yaml"
    path.write_text(
        (own.root / "own.yaml").read_text() + "explain:\n  own_runs: true\n  repeats: 2\n"
        "  max_repeats: 2\n  path: false\n  minimal: false\n"
    )
    before = load_runs(load("own", own.db))
    done = cli("explain", "--study", "own", "--storage", own.url, "--study-file", str(path),
               "--no-own-runs", cwd=own.root)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "borrowed" not in done.stdout.split("explaining trial")[0]
    assert "done: 0 runs in" in done.stdout
    again = cli("explain", "--study", "own", "--storage", own.url, "--study-file", str(path),
                cwd=own.root)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "from study 'own'" in again.stdout and "done: 0 runs in" in again.stdout
    assert load_runs(load("own", own.db)) == before


def test_a_run_the_study_lent_of_what_is_now_the_winner_is_not_read(own: OwnRuns) -> None:
    """A configuration lent while another trial won, then winning itself: its lent run would
    be the winner's own figure. Stored, it is left out of what the explanation reads."""
    from autotune.explain.record import run_key

    study = load("own", own.db)
    e = own.result
    win = e.winner_measured.key
    assert win is not None
    [first] = [r for r in load_runs(study)[win] if r.index == 0]
    lent = first.model_copy(update={"index": 2, "values": [1e9], "source": "own#1"})
    study.set_user_attr(run_key(win, 2), lent.model_dump(mode="json"))
    done = cli("explain", "--study", "own", "--storage", own.url, "--study-file",
               str(own.root / "own.yaml"), *REPEATS, "--own-runs", cwd=own.root)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done: 0 runs in" in done.stdout
    again = load_explanation(load("own", own.db))
    assert again is not None and again.winner_measured.n == 2
    assert 1e9 not in again.winner_measured.values
    assert len(load_runs(load("own", own.db))[win]) == 3  # kept in storage
    # a third run of each: the winner's goes after the unread one, which stays as it was
    more = cli("explain", "--study", "own", "--storage", own.url, "--study-file",
               str(own.root / "own.yaml"), "--repeats", "3", "--max-repeats", "3", "--no-path",
               "--no-minimal", "--own-runs", cwd=own.root)  # fmt: skip
    assert more.returncode == 0, more.stdout + more.stderr
    stored = load_runs(load("own", own.db))[win]
    assert [r.index for r in stored] == [0, 1, 2, 3]
    assert [r.source for r in stored] == [None, None, "own#1", None]
    assert stored[2].values == [1e9]
    final = load_explanation(load("own", own.db))
    assert final is not None and final.winner_measured.n == 3
    assert 1e9 not in final.winner_measured.values
