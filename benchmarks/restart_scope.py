"""Restart only what changed: ``Launcher.apply`` (restarts the services whose spec changed)
vs restarting every service each trial, on the same configurations, side by side.

The configurations are the ones a study launches, in order: the tuning loop of
``benchmarks/sample_efficiency.py`` (``run_one``: the bundled study's space, the real
``make_sampler``, baseline enqueued first, forbidden proposals and duplicates never launched,
crashes told the runner's failed values) against the performance model, without servers.
The default sampler (``tpe``: most trials after the start-up move a few levers of the best
trial) and random search (every lever changes) give one sequence each. Each sequence is then
applied to the bundled simulated deployment (``launchers/sim-dsv4-flash-pd.yaml``) by two
launchers with their own run directories and ports, alternating config by config (and which
goes first) so machine load falls on both alike: (a) ``apply`` alone, (b) ``stop_all`` then
``apply``. A start-up failure (``LaunchError``: CUDA OOM, ...) is counted and the sequence
goes on, as in the runner. Prints, per sampler and mode, the restart seconds per trial and
the services (re)started per trial; the first apply of a sequence (everything starts in both
modes) is left out. Also checks that (a) starts no service whose fingerprint is unchanged
and that is still running, and (``--count-configs``, no servers) counts the services whose
rendered spec changes from launch to launch over a longer sequence. Usage:

    .venv/bin/python benchmarks/restart_scope.py --configs 40 --seed 0 --samplers tpe,random
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from sample_efficiency import Launch, load_surface, run_one  # noqa: E402

from autotune.deployment import Deployment, load_deployment  # noqa: E402
from autotune.errors import LaunchError  # noqa: E402
from autotune.launch.base import Launcher  # noqa: E402
from autotune.launch.factory import make_launcher  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.space import SearchSpace  # noqa: E402
from autotune.study.definition import load_study_definition  # noqa: E402
from autotune.study.samplers import TPE_STARTUP_TRIALS  # noqa: E402

STUDY_FILE = REPO / "studies" / "dsv4-flash-sim.yaml"
MODES = ("changed", "everything")
"""(a) ``apply`` alone: only what changed; (b) ``stop_all`` then ``apply``."""
WORKERS = ("prefill", "decode")


# ---------------------------------------------------------------------------- sequences


@dataclass
class Launches:
    """The configurations one study launches, in order, and what it skipped on the way."""

    sampler: str
    configs: list[dict[str, Any]]
    model_failures: list[str | None]
    proposals: int
    forbidden: int
    duplicates: int
    startup_launches: int
    """Launches among the baseline and the sampler's random start-up trials."""


def launch_sequence(sampler: str, seed: int, n: int) -> Launches:
    """The first ``n`` configurations the tuning loop launches with ``sampler``."""
    surface = load_surface("dsv4-sim")
    trials = n + 10
    while True:
        launched: list[tuple[dict[str, Any], Launch]] = []

        def evaluate(config: Any, _launched: list = launched) -> Launch:
            result = surface.evaluate(config)
            _launched.append((dict(config), result))
            return result

        run = run_one(dataclasses.replace(surface, evaluate=evaluate), sampler, seed, trials)
        if len(launched) >= n:
            break
        trials *= 2
    # Trials up to and including the n-th launch.
    numbers = [i for i, k in enumerate(run.kinds) if k == "launch"]
    last = numbers[n - 1]
    kinds = run.kinds[: last + 1]
    return Launches(
        sampler=sampler,
        configs=[c for c, _ in launched[:n]],
        model_failures=[r.failure for _, r in launched[:n]],
        proposals=last + 1,
        forbidden=kinds.count("forbidden"),
        duplicates=kinds.count("duplicate"),
        startup_launches=sum(i <= TPE_STARTUP_TRIALS for i in numbers[:n]),
    )


# ---------------------------------------------------------------------------- launchers


@dataclass
class Row:
    """One apply: wall seconds (stop included), services started, failure class."""

    seconds: float
    started: list[str]
    failure: str | None
    stop_seconds: float = 0.0  # stop_all (everything) + the apply's own stops
    start_seconds: dict[str, float] = field(default_factory=dict)  # start-to-healthy
    waited: list[str] = field(default_factory=list)  # started by an earlier, failed apply
    extra: list[str] = field(default_factory=list)  # started although unchanged and running


@dataclass
class Side:
    """One mode: its deployment (own ports), launcher and run directory."""

    mode: str
    deployment: Deployment
    launcher: Launcher
    run_dir: Path
    fingerprints: dict[str, str] = field(default_factory=dict)

    def apply(self, space: SearchSpace, config: Mapping[str, Any]) -> Row:
        specs = render(space, self.deployment, dict(config), run_dir=self.run_dir)
        alive = set(self.launcher.running())
        expected = {
            name
            for name, spec in specs.items()
            if name not in alive or self.fingerprints.get(name) != spec.fingerprint()
        }
        started: list[str] = []
        waited: list[str] = []

        def on_event(service: str, event: str) -> None:
            if event == "starting":
                started.append(service)
            elif event == "waiting":
                waited.append(service)

        failure = None
        stop_seconds = 0.0
        start_seconds: dict[str, float] = {}
        t0 = time.monotonic()
        try:
            if self.mode == "everything":
                self.launcher.stop_all()
                stop_seconds = time.monotonic() - t0
            result = self.launcher.apply(specs, on_event=on_event)
            stop_seconds += result.stop_seconds
            start_seconds = dict(result.seconds)
        except LaunchError as exc:
            failure = exc.failure
        seconds = time.monotonic() - t0
        # Whatever runs now was kept or started from these specs (stopped ones are forgotten).
        self.fingerprints = {n: s.fingerprint() for n, s in specs.items()}
        extra = [] if self.mode == "everything" else [n for n in started if n not in expected]
        return Row(
            seconds,
            started,
            failure,
            stop_seconds=stop_seconds,
            start_seconds=start_seconds,
            waited=waited,
            extra=extra,
        )


def fingerprint_changes(
    space: SearchSpace, deployment: Deployment, configs: Sequence[Mapping[str, Any]]
) -> list[list[str]]:
    """Per launch after the first: the services whose rendered spec differs from the
    previous launch's (what ``apply`` restarts when nothing crashed), without servers."""
    run_dir = Path(tempfile.gettempdir()) / "autotune-restart-scope"
    prints = [
        {n: s.fingerprint() for n, s in render(space, deployment, dict(c), run_dir=run_dir).items()}
        for c in configs
    ]
    return [[n for n in cur if prev.get(n) != cur[n]] for prev, cur in pairwise(prints)]


def nearest_changes(
    space: SearchSpace, deployment: Deployment, configs: Sequence[Mapping[str, Any]]
) -> list[int]:
    """Per launch after the first: the fewest services whose spec differs from any earlier
    launch's (a local move starts from the best trial, not from the previous one)."""
    run_dir = Path(tempfile.gettempdir()) / "autotune-restart-scope"
    prints = [
        {n: s.fingerprint() for n, s in render(space, deployment, dict(c), run_dir=run_dir).items()}
        for c in configs
    ]
    return [
        min(sum(old.get(n) != cur[n] for n in cur) for old in prints[:i])
        for i, cur in enumerate(prints)
        if i
    ]


def _deployments(path: Path) -> tuple[Deployment, Deployment]:
    """Two copies of the deployment whose ``auto`` ports do not collide."""
    first = load_deployment(path)
    taken = set(first.ports().values())
    for _ in range(20):
        second = load_deployment(path)
        if not taken & set(second.ports().values()):
            return first, second
    raise SystemExit("could not pick disjoint ports for the two launchers")


def replay(sides: Sequence[Side], space: SearchSpace, seq: Launches) -> dict[str, list[Row]]:
    """Apply every configuration with both sides, alternating which goes first."""
    for side in sides:
        side.launcher.stop_all()
        side.fingerprints = {}
    rows: dict[str, list[Row]] = {side.mode: [] for side in sides}
    for i, config in enumerate(seq.configs):
        order = sides if i % 2 == 0 else list(reversed(sides))
        for side in order:
            rows[side.mode].append(side.apply(space, config))
    return rows


# ---------------------------------------------------------------------------- report


def summarize(rows: Sequence[Row], *, skip: int = 1) -> dict[str, Any]:
    """Figures over the applies after the first ``skip`` (the first apply starts everything
    in both modes)."""
    rest = rows[max(1, skip) :]
    secs = [r.seconds for r in rest]
    counts = [len(r.started) for r in rest]
    n = len(rest)
    ok = [r for r in rest if r.failure is None]
    router = [r.start_seconds["router"] for r in ok if "router" in r.start_seconds]
    return {
        "trials": n,
        "mean_s": statistics.mean(secs),
        "median_s": statistics.median(secs),
        "services": statistics.mean(counts),
        "workers": statistics.mean(sum(s in WORKERS for s in r.started) for r in rest),
        "router": statistics.mean(("router" in r.started) for r in rest),
        "share": {k: sum(c == k for c in counts) / n for k in (0, 1, 2, 3)},
        "by_count": {
            k: statistics.mean(r.seconds for r in ok if len(r.started) == k)
            for k in (1, 2, 3)
            if any(len(r.started) == k for r in ok)
        },
        "failures": [r.failure for r in rest if r.failure],
        "waited": sum(len(r.waited) for r in rest),
        "stop_s": statistics.mean(r.stop_seconds for r in ok) if ok else math.nan,
        "router_s": statistics.mean(router) if router else math.nan,
        "extra": [(i + max(1, skip), r.extra) for i, r in enumerate(rest) if r.extra],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=40, help="launched configs per sampler")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samplers", default="tpe,random", help="comma-separated")
    parser.add_argument(
        "--count-configs",
        type=int,
        default=150,
        help="also count fingerprint changes (no servers) over this many launches; 0: off",
    )
    args = parser.parse_args(argv)
    if args.configs < 2:
        parser.error("--configs must be at least 2 (the first apply is left out)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    definition = load_study_definition(STUDY_FILE)
    samplers = [s for s in args.samplers.split(",") if s]
    sequences = [launch_sequence(s, args.seed, args.configs) for s in samplers]
    space = load_surface("dsv4-sim").space
    dep_a, dep_b = _deployments(definition.resolve(definition.deployment))
    results: dict[str, dict[str, list[Row]]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="autotune-restart-scope-") as tmp_name:
        tmp = Path(tmp_name)
        sides: list[Side] = []
        try:
            for mode, dep in zip(MODES, (dep_a, dep_b), strict=True):
                run_dir = tmp / mode
                sides.append(Side(mode, dep, make_launcher(dep, run_dir=run_dir), run_dir))
            for seq in sequences:
                results[seq.sampler] = replay(sides, space, seq)
        finally:
            for side in sides:
                try:
                    side.launcher.stop_all()
                finally:
                    side.launcher.close()
    wall = time.monotonic() - started
    print(f"seed {args.seed}, {args.configs} launched configs per sampler, {wall:.0f} s wall")
    for seq in sequences:
        crashes = sum(f is not None for f in seq.model_failures)
        print(
            f"\n{seq.sampler}: {seq.proposals} proposals -> {len(seq.configs)} launched "
            f"({seq.forbidden} forbidden, {seq.duplicates} duplicates skipped; "
            f"{crashes} fail at start-up or serve wrong text in the model)"
        )
        summary = {mode: summarize(rows) for mode, rows in results[seq.sampler].items()}
        for mode, s in summary.items():
            share = " / ".join(f"{100 * s['share'][k]:.0f}%" for k in (0, 1, 2, 3))
            print(
                f"  {mode:10s} restart per trial mean {s['mean_s']:.2f} s, median "
                f"{s['median_s']:.2f} s; services started {s['services']:.2f} (workers "
                f"{s['workers']:.2f}, router {s['router']:.2f}); 0/1/2/3 services: {share}; "
                f"failures {s['failures']}; waits {s['waited']}; stopping {s['stop_s']:.2f} s, "
                f"router start {s['router_s']:.2f} s"
            )
            by = ", ".join(f"{k}: {v:.2f} s" for k, v in s["by_count"].items())
            print(f"  {mode:10s} mean seconds by services started (no failure): {by}")
            if mode == "changed":
                print(f"  {mode:10s} started though unchanged and running: {s['extra'] or 'none'}")
        k = seq.startup_launches
        if 1 < k < len(seq.configs):
            late = {m: summarize(rows, skip=k) for m, rows in results[seq.sampler].items()}
            share = " / ".join(f"{100 * late['changed']['share'][j]:.0f}%" for j in (0, 1, 2, 3))
            print(
                f"  after the start-up (launches {k + 1}-{len(seq.configs)}, trial numbers > "
                f"{TPE_STARTUP_TRIALS}): changed {late['changed']['mean_s']:.2f} s, "
                f"{late['changed']['services']:.2f} services (0/1/2/3: {share}); everything "
                f"{late['everything']['mean_s']:.2f} s, "
                f"{late['everything']['mean_s'] / late['changed']['mean_s']:.2f}x"
            )
        a, b = summary["changed"], summary["everything"]
        print(
            f"  everything / changed: {b['mean_s'] / a['mean_s']:.2f}x mean seconds, "
            f"{b['median_s'] / a['median_s']:.2f}x median, "
            f"{b['services'] / a['services']:.2f}x services, "
            f"{b['workers'] / a['workers']:.2f}x worker starts"
        )
        differ = [
            i
            for i, (ra, rb) in enumerate(
                zip(
                    results[seq.sampler]["changed"],
                    results[seq.sampler]["everything"],
                    strict=True,
                )
            )
            if (ra.failure is None) != (rb.failure is None)
        ]
        if differ:
            print(f"  configs that failed in one mode only: {differ}")
    if args.count_configs > 1:
        deployment = load_deployment(definition.resolve(definition.deployment))
        print(f"\nfingerprint changes over {args.count_configs} launches (no servers):")
        for sampler in samplers:
            seq = launch_sequence(sampler, args.seed, args.count_configs)
            changes = fingerprint_changes(space, deployment, seq.configs)
            after_startup = changes[max(seq.startup_launches, 1) - 1 :]
            for label, part in (("all", changes), ("after the start-up", after_startup)):
                counts = [len(c) for c in part]
                one = [c[0] for c in part if len(c) == 1]
                print(
                    f"  {sampler:7s} {label:18s} ({len(part)} launches): services changed "
                    f"mean {statistics.mean(counts):.2f}; 0/1/2 workers: "
                    + " / ".join(f"{100 * counts.count(k) / len(part):.0f}%" for k in (0, 1, 2))
                    + f" (one: {one.count('prefill')} prefill, {one.count('decode')} decode)"
                )
            near = nearest_changes(space, deployment, seq.configs)
            print(
                f"  {sampler:7s} one worker from the nearest earlier launch (not the previous): "
                f"{100 * near.count(1) / len(near):.0f}% of {len(near)} launches"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
