"""Tried for issue 16 part 4, and not adopted: a race whose estimates borrow strength from a model.

With 80-170 configurations measured once at 3-8% noise, the best single run is a fluke as
often as not. The idea: shrink each configuration's measured log-throughput toward a
random-forest prediction from the *other* configurations (out-of-bag), an empirical-Bayes
posterior (prior variance = residual variance minus the noise), race on the posterior
(leader = highest posterior mean; contender = posterior upper bound above the leader's
lower bound x 1.01; the restart to whichever has fewer runs), and pick the highest posterior
mean ("shrink6") or lower 90% bound ("shrink6-lcb"). Against the product's race
(``RacePolicy(budget=6)`` + ``race.winner``), same studies, same budget, same noise draws:

    .venv/bin/python benchmarks/winner_shrinkage.py \\
        gen-medium-0,gen-hard-0,gen-heldout-0 6 10 100 surface
    .venv/bin/python benchmarks/winner_shrinkage.py dsv4-sim,vllm-serving,gemm-kernel 8 20 200 0.05

Arguments: surfaces, studies per surface, replays per study, trials per study, noise (a
lognormal sigma or ``surface``). Results in BENCHMARKS.md ("Fixed top-k or a race").
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_efficiency import load_surface, run_one
from sklearn.ensemble import RandomForestRegressor
from winner_choice import Finished, Measured, replay_study

from autotune.study.race import RacePolicy

warnings.simplefilter("ignore")
optuna.logging.set_verbosity(optuna.logging.ERROR)


def features(configs):
    keys = sorted({k for c in configs for k in c})
    cols = []
    for k in keys:
        vals = [c.get(k) for c in configs]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(nums) == len([v for v in vals if v is not None]) and nums:
            lo, hi = min(nums), max(nums)
            f = math.log if lo > 0 and hi / lo > 20 else float
            a = [f(v) for v in nums]
            lo, hi = min(a), max(a)
            cols.append([(-1.0 if v is None else (f(v) - lo) / ((hi - lo) or 1)) for v in vals])
        else:
            for choice in sorted({repr(v) for v in vals}):
                cols.append([1.0 if repr(v) == choice else 0.0 for v in vals])
    return np.array(cols).T


def prior(configs, logy, seed):
    X = features(configs)
    m = RandomForestRegressor(
        n_estimators=300, min_samples_leaf=2, max_features=0.5, oob_score=True, random_state=seed
    )
    m.fit(X, logy)
    pred = m.oob_prediction_
    return pred


_CACHE: dict[tuple[str, int, float], np.ndarray] = {}


def shrink_replay(study, configs, budget, rng, sigma_known=None, final="mean"):
    nums = [c.number for c in study.configs]
    by = {c.number: c for c in study.configs}
    logs = {n: [math.log(by[n].first)] for n in nums}
    X = [configs[n] for n in nums]
    key = (study.surface, study.seed, study.noise)
    if key not in _CACHE:
        _CACHE[key] = prior(X, np.array([logs[n][0] for n in nums]), study.seed)
    m = _CACHE[key]
    mp = dict(zip(nums, m, strict=True))
    sig2 = (sigma_known if sigma_known is not None else 0.05) ** 2
    resid = np.array([logs[n][0] - mp[n] for n in nums])
    tau2 = max(float(np.var(resid)) - sig2, 0.01**2)

    def post():
        out = {}
        for n in nums:
            k = len(logs[n])
            prec = 1 / tau2 + k / sig2
            mu = (mp[n] / tau2 + sum(logs[n]) / sig2) / prec
            out[n] = (mu, 1 / math.sqrt(prec), k)
        return out

    spent = 0
    z = 1.96
    while spent < budget:
        p = post()
        lead = max(nums, key=lambda n: p[n][0])
        lo = p[lead][0] - z * p[lead][1]
        rivals = [n for n in nums if n != lead and p[n][0] + z * p[n][1] > lo + math.log(1.01)]
        if not rivals:
            break
        rival = max(rivals, key=lambda n: p[n][0] + z * p[n][1])
        pick = lead if len(logs[lead]) <= len(logs[rival]) else rival
        c = by[pick]
        logs[pick].append(math.log(c.true) + rng.normal(0, c.sigma))
        spent += 1
    p = post()
    if final == "mean":
        w = max(nums, key=lambda n: p[n][0])
    else:
        w = max(nums, key=lambda n: p[n][0] - 1.645 * p[n][1])
    return w


def main():
    noise = sys.argv[5] if len(sys.argv) > 5 else "surface"
    names = sys.argv[1].split(",")
    seeds = int(sys.argv[2])
    replays = int(sys.argv[3])
    trials = int(sys.argv[4]) if len(sys.argv) > 4 else 100
    for name in names:
        s = load_surface(name)
        rows: dict[str, list[float]] = {"race6": [], "shrink6": [], "shrink6-lcb": [], "none": []}
        for seed in range(1000, 1000 + seeds):
            run = run_one(
                s,
                "tpe",
                seed,
                trials,
                sigma=s.noise_sigma if noise == "surface" else (lambda c, v=float(noise): v),
            )
            ms = tuple(
                Measured(
                    number=i, true=run.true_values[i], first=run.observed[i], sigma=run.sigmas[i]
                )
                for i, k in enumerate(run.kinds)
                if k == "launch" and run.failures[i] is None and run.true_values[i] > 0
            )
            st = Finished(name, noise, seed, ms)
            top = st.best_true
            true = {c.number: c.true for c in ms}
            sig = float(np.median([c.sigma for c in ms]))
            rng = np.random.default_rng([seed, 1])
            rng2 = np.random.default_rng([seed, 1])
            rng3 = np.random.default_rng([seed, 1])
            for _ in range(replays):
                rows["race6"].append(
                    1 - true[replay_study(st, RacePolicy(budget=6), rng).winner] / top
                )
                rows["shrink6"].append(1 - true[shrink_replay(st, run.configs, 6, rng2, sig)] / top)
                rows["shrink6-lcb"].append(
                    1 - true[shrink_replay(st, run.configs, 6, rng3, sig, final="lcb")] / top
                )
            rows["none"].append(1 - true[replay_study(st, None, rng).winner] / top)
        for k, values in rows.items():
            v = np.array(values)
            print(
                f"{name} {k:12s} within2%={100 * np.mean(v <= 0.02 + 1e-12):5.1f}% "
                f"shortfall={100 * v.mean():.2f}%"
            )


main()
