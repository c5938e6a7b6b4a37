"""The autotune arm: the study run by ``autotune run`` to an exact budget of server restarts,
and the restart count read back from any stored study (what the H200 reader uses too)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .processes import Processes
from .setup import SERVICE, Setup, changed, fresh_dir

STUDY_NAME = "vllm-side-by-side"
"""The autotune arm's own study (a copy of --study's file) unless --autotune-storage."""


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


def autotune_counts(storage: str, study_name: str = STUDY_NAME) -> dict[str, Any]:
    """Restarts spent, from the stored trials and re-measurements.

    A trial launched a server when it finished (COMPLETE) or failed (FAIL: refused at start,
    crashed, or cut by an interruption, as the H200 dense study's #14 when the machine went
    back) and is neither a reused duplicate (``reused_from``) nor a forbidden proposal
    (``failure: forbidden``): those start nothing. A RUNNING trial (a snapshot taken while it
    ran) is counted apart, in ``running``: its server was starting or serving."""
    import optuna

    from autotune.results import launched, load_remeasurements

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        started = t.state.name in ("COMPLETE", "FAIL") and launched(t)
        metrics = a.get("metrics") or {}
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "launched": started,
                "baseline": bool(a.get("is_baseline")),
                "throughput": metrics.get("output_throughput"),
                "failure": a.get("failure"),
                "reused_from": a.get("reused_from"),
                "aborted": a.get("aborted"),
                "restart_s": (a.get("phase_seconds") or {}).get("restart"),
                "config": a.get("config"),
            }
        )
    remeasured = load_remeasurements(study)
    return {
        "trials": rows,
        "launched": sum(r["launched"] for r in rows),
        "running": sum(r["state"] == "RUNNING" for r in rows),
        "reused": sum(r["reused_from"] is not None for r in rows),
        "forbidden": sum(r["failure"] == "forbidden" for r in rows),
        "remeasurements": [
            {"of": m.of, "repeat": m.repeat, "throughput": m.throughput, "failure": m.failure}
            for m in remeasured
        ],
    }


def _complete(counts: dict[str, Any]) -> int:
    return sum(r["state"] == "COMPLETE" for r in counts["trials"])


ROUNDS = 20
"""At most this many ``autotune run`` calls to reach the launches the budget asks for."""
BARREN = 24
"""Proposals in a row that launched nothing (duplicates reused, configurations the space
forbids) after which the search stops: a small grid visited, or a sampler redrawing what it
drew. Not fewer: a random draw over the dense H200 space is forbidden or a duplicate about
one time in three (8 of its 25 draws that were not replays of the seed), and on 2026-12-07 a
round of 2 proposals, both forbidden, stopped the random arm 2 launches short (0.32^2: one
round in ten); 24 in a row happen by chance about once in 10^12 at that rate, and cost
nothing but the sampler's time."""


def launch_rounds(
    want_trials: int,
    counts: dict[str, Any],
    *,
    run: Callable[[int], None],
    recount: Callable[[], dict[str, Any]],
    rounds: int = ROUNDS,
    barren: int = BARREN,
) -> dict[str, Any]:
    """Call ``run(target)`` (``autotune run --trials target``) until ``want_trials`` trials
    launched a server; the counts (:func:`autotune_counts`) after the last call.

    ``--trials`` counts COMPLETE trials, forbidden and reused ones too, which launch nothing:
    each round asks for the launches still missing on top of the study's trials. ``barren``
    proposals in a row that launched nothing end the search (every proposal a duplicate or
    forbidden: a small grid visited, or a sampler redrawing what it drew; before per-trial
    seeding a seeded sampler rebuilt by each ``autotune run`` did that, 19 rounds in a row on
    the H200). A round that launched something starts the count again."""
    in_a_row = 0
    for _ in range(rounds):
        # A RUNNING trial (snapshot taken while it ran) is launched: the next run completes
        # it from the journal or records it as interrupted (FAIL); either way it counts.
        launched = counts["launched"] + counts.get("running", 0)
        short = want_trials - launched
        if short <= 0:
            break
        if counts["launched"]:
            print(f"  {counts['launched']} of {want_trials} trials launched: {short} more")
        run(_complete(counts) + short)
        counts = recount()
        if counts["launched"] + counts.get("running", 0) > launched:
            in_a_row = 0
            continue
        in_a_row += short
        if in_a_row >= barren:
            print(f"  {in_a_row} proposals in a row launched nothing: stopping the search")
            break
        print(f"  a round of {short} proposals launched nothing ({in_a_row} in a row)")
    return counts


def _autotune_line(line: str) -> bool:
    return bool(line.strip())


def arm_autotune(
    setup: Setup,
    procs: Processes,
    budget: int,
    *,
    storage: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """``storage`` None: a fresh study ``vllm-side-by-side`` in OUT/autotune (kept with
    ``resume``); else the study file's own study there, resumed where it stands."""
    import optuna

    from autotune.results import baseline_trial, best_estimate

    d = setup.out / "autotune"
    raw = yaml.safe_load(setup.study_file.read_text())
    raw.update(space=str(setup.space_file), deployment=str(setup.deployment_file))
    if storage is None:
        if not resume or not (d / "autotune.db").is_file():
            fresh_dir(d)
        storage = f"sqlite:///{d / 'autotune.db'}"
        raw.update(name=STUDY_NAME, seed=setup.seed)
    d.mkdir(parents=True, exist_ok=True)
    name = str(raw["name"])
    study = setup.study
    top_k, repeats = remeasure_plan(budget, study.remeasure.top_k, study.remeasure.repeats)
    want_trials = budget - top_k * repeats
    files = {}
    for phase, (k, r) in (("trials", (0, 0)), ("remeasure", (top_k, repeats))):
        remeasure = {**(raw.get("remeasure") or {}), "top_k": k, "repeats": r}
        if "budget" in remeasure:
            remeasure["budget"] = k * r
        files[phase] = d / f"study-{phase}.yaml"
        files[phase].write_text(yaml.safe_dump({**raw, "remeasure": remeasure}))
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
            name,
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
        f"  autotune ({name}, {storage}): {want_trials} launched trials + {top_k} x {repeats} "
        f"re-measurements = {budget} restarts",
        flush=True,
    )
    t0 = time.monotonic()
    counts: dict[str, Any] = {"launched": 0, "trials": []}
    if Path(storage.removeprefix("sqlite:///")).is_file():
        with contextlib.suppress(KeyError):  # a resumed study continues from its trials
            counts = autotune_counts(storage, name)
    url = storage
    counts = launch_rounds(
        want_trials,
        counts,
        run=lambda target: autotune_run("trials", target),
        recount=lambda: autotune_counts(url, name),
    )
    target = max(_complete(counts), 1)
    if top_k * repeats:
        autotune_run("remeasure", target)
    wall = time.monotonic() - t0
    counts = autotune_counts(storage, name)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opt_study = optuna.load_study(study_name=name, storage=storage)
    est = best_estimate(opt_study)
    base = baseline_trial(opt_study)
    restarts = counts["launched"] + len(counts["remeasurements"])
    result: dict[str, Any] = {
        "arm": "autotune",
        "study": name,
        "study_file": str(setup.study_file),
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
