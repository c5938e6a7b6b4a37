"""Generated tuning surfaces (benchmarks/surfaces/generated.py): reproducible, parseable by
the real space loader, an exact optimum and needle fraction, crash and trap regions that
random configurations reach, engine upgrades, and the sample-efficiency harness runs on
them."""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sampler_helpers import load_harness, quiet_optuna  # noqa: F401

from autotune.space.loader import parse_space

REPO = Path(__file__).resolve().parents[2]
ONE_OF_EACH = ("gen-easy-0", "gen-medium-0", "gen-hard-0")


pytestmark = pytest.mark.usefixtures("quiet_optuna")


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return load_harness()


@pytest.fixture(scope="module")
def gen(harness: ModuleType) -> ModuleType:
    return harness.generated_module()


@pytest.fixture(scope="module")
def fam(gen: ModuleType) -> list[Any]:
    started = time.perf_counter()
    surfaces = gen.family(30)
    took = time.perf_counter() - started
    assert took / len(surfaces) < 1.0, f"{took:.1f} s for 30 surfaces"
    return surfaces


def _draws(surface: Any, count: int, seed: int = 1) -> Iterator[tuple[dict, bool, Any]]:
    """(config, forbidden, result) for ``count`` draws of ``SearchSpace.random_config``."""
    rng = random.Random(seed)
    space = surface.space
    for _ in range(count):
        config = space.random_config(rng)
        yield config, bool(space.violations(config)), surface.evaluate(config)


def test_same_seed_same_surface(gen: ModuleType) -> None:
    a, b = gen.generate(5, level="hard"), gen.generate(5, level="hard")
    assert a == b and a is not b
    assert a.space_data == b.space_data and a.optimum_config == b.optimum_config
    rng = random.Random(3)
    for _ in range(200):
        config = a.space.random_config(rng)
        assert a.evaluate(config) == b.evaluate(config)
        assert a.noise_sigma(config) == b.noise_sigma(config)
    assert gen.by_name("gen-hard-5") == a
    others = [gen.generate(6, level="hard"), gen.generate(5, level="medium")]
    for other in others:
        assert other != a
        assert other.space_data != a.space_data
        assert other.optimum != a.optimum


def test_family_mixes_levels_and_names(
    gen: ModuleType, fam: list[Any], harness: ModuleType
) -> None:
    assert [s.name for s in fam] == gen.family_names(30)
    assert {lvl: sum(s.level == lvl for s in fam) for lvl in gen.LEVELS} == {
        "easy": 10,
        "medium": 10,
        "hard": 10,
    }
    assert len({s.name for s in fam}) == 30
    assert gen.family_names(3, first_seed=4) == ["gen-easy-4", "gen-medium-4", "gen-hard-4"]
    names = harness.expand_surfaces(["family:30", "gemm-kernel", "family:3:4"])
    assert names == [*gen.family_names(30), "gemm-kernel", *gen.family_names(3, first_seed=4)]
    with pytest.raises(ValueError):
        gen.generate(0, level="impossible")


def test_every_family_space_parses_with_a_launchable_baseline(
    gen: ModuleType, fam: list[Any]
) -> None:
    kinds: set[str] = set()
    for s in fam:
        space = parse_space(copy.deepcopy(s.space_data), file=f"<{s.name}>")
        assert s.space_data["engine"] == {"name": "generic"}
        params = s.space_data["parameters"]
        lo, hi = gen.LEVER_COUNTS[s.level]
        assert lo <= len(params) <= hi and s.n_levers == len(params)
        for spec in params.values():
            kinds.add(spec["type"] + ("-log" if spec.get("log") else ""))
            if spec["type"] == "float":
                assert "step" in spec
            if spec["type"] == "categorical":
                assert 2 <= len(spec["choices"]) <= 6
        if s.level != "easy":
            assert any("when" in spec for spec in params.values()), s.name
            assert s.space_data.get("forbidden"), s.name
        baseline = space.baseline_config()
        assert not space.violations(baseline)
        result = s.evaluate(baseline)
        assert result.failure is None, (s.name, result)
        assert result.value == pytest.approx(s.baseline_value)
        share = s.baseline_value / s.optimum
        assert gen.BASELINE_BAND[0] <= share <= gen.BASELINE_BAND[1], (s.name, share)
    assert {"categorical", "int", "int-log", "float", "bool"} <= kinds


def test_needle_fraction_in_the_level_band(gen: ModuleType, fam: list[Any]) -> None:
    for s in fam:
        lo, hi = gen.BANDS[s.level]
        assert lo <= s.needle_fraction <= hi, (s.name, s.needle_fraction)
        if s.level == "hard":
            assert s.needle_fraction < 0.001
    by_level = {lvl: sorted(s.needle_fraction for s in fam if s.level == lvl) for lvl in gen.LEVELS}
    assert by_level["easy"][0] > by_level["medium"][-1] > 0
    assert sorted(by_level["medium"])[5] > sorted(by_level["hard"])[5]


def test_optimum_is_exact_and_never_beaten(fam: list[Any]) -> None:
    for s in fam:
        assert not s.space.violations(s.optimum_config)
        best = s.evaluate(s.optimum_config)
        assert best.failure is None and best.value == s.optimum
        assert s.space.complete(s.optimum_config) == s.optimum_config
        for _, forbidden, result in _draws(s, 300, seed=7):
            if not forbidden and result.failure is None:
                assert result.value <= s.optimum


@pytest.mark.parametrize("name", ONE_OF_EACH)
def test_random_configs_match_the_exact_figures(gen: ModuleType, name: str) -> None:
    """20k draws of the space's own random distribution: none beats the optimum, the
    share within 5% agrees with the exact needle fraction, the failure shares with the
    exact ones, every forbidden draw is one the evaluator also refuses, and random draws
    reach both the crash regions and the wrong-output trap."""
    s = gen.by_name(name)
    n = 20_000
    hits = 0
    counts: dict[str, int] = {}
    for config, forbidden, result in _draws(s, n):
        assert forbidden == (result.failure == "config_rejected"), config
        key = "forbidden" if forbidden else (result.failure or "ok")
        counts[key] = counts.get(key, 0) + 1
        if result.failure is None:
            assert result.value <= s.optimum
            hits += result.value >= gen.WITHIN * s.optimum * (1 - 1e-9)
    p = s.needle_fraction
    assert abs(hits - n * p) <= 4.5 * math.sqrt(n * p * (1 - p)) + 2, (hits, n * p)
    for key, share in s.shares.items():
        got = counts.get(key, 0)
        assert abs(got - n * share) <= 4.5 * math.sqrt(n * share * (1 - share)) + 2, key
    assert counts["cuda_oom"] > 0.02 * n and counts["wrong_output"] > 0.01 * n
    if s.level != "easy":
        assert counts["crashed"] > 0 and counts["forbidden"] > 0


def test_every_surface_has_crash_and_trap_regions(fam: list[Any]) -> None:
    for s in fam:
        failures = {r.failure for _, forbidden, r in _draws(s, 400) if not forbidden}
        assert {"cuda_oom", "wrong_output"} <= failures, (s.name, failures)
        assert s.shares["cuda_oom"] >= 0.03 and s.shares["wrong_output"] >= 0.02


def test_trap_is_fast_but_wrong_and_hard_traps_sit_next_to_the_optimum(
    gen: ModuleType, fam: list[Any]
) -> None:
    for s in fam:
        trap = s.recipe.lever(s.recipe.roles["trap"])
        flipped = dict(s.optimum_config, **{trap.name: trap.values[-1]})
        result = s.evaluate(flipped)
        if s.level == "hard":  # one lever from the optimum: faster, and wrong
            assert result.failure == "wrong_output", s.name
            assert result.latency_ms < s.evaluate(s.optimum_config).latency_ms


def test_needles_pay_only_in_full(gen: ModuleType, fam: list[Any]) -> None:
    """Medium and hard optima sit on their needle; moving any one of its choices loses
    more than the needle fraction's 5% (no partial credit)."""
    for s in fam:
        r = s.recipe
        key = {"medium": "needle2", "hard": "needle3"}.get(s.level)
        if key is None:
            continue
        roles = ("a", "b", "c")[: 3 if key == "needle3" else 2]
        at_optimum = {lv.name: 0 for lv in r.levers} | r.codes_from_config(s.optimum_config)
        for role in roles:
            lever = r.lever(r.roles[role])
            for code in range(lever.n):
                if lever.values[code] == s.optimum_config[lever.name]:
                    continue
                config = r.config_from_codes(dict(at_optimum, **{lever.name: code}))
                result = s.evaluate(config)
                if result.failure is None:
                    assert result.value < gen.WITHIN * s.optimum, (s.name, lever.name, code)


def test_heteroscedastic_noise(gen: ModuleType) -> None:
    for name in ONE_OF_EACH:
        s = gen.by_name(name)
        sigmas = [s.noise_sigma(c) for c, _, _ in _draws(s, 500)]
        assert min(sigmas) >= gen.SIGMA_RANGE[0] and max(sigmas) <= gen.SIGMA_RANGE[1]
        assert max(sigmas) > 1.5 * min(sigmas)
        batch = s.recipe.lever(s.recipe.roles["batch"])
        low = dict(s.space.baseline_config(), **{batch.name: batch.values[0]})
        high = dict(low, **{batch.name: batch.values[-1]})
        assert s.noise_sigma(high) > s.noise_sigma(low)
    hard = [gen.by_name(n).noise_sigma(gen.by_name(n).optimum_config) for n in ONE_OF_EACH]
    assert hard[2] > hard[0]


def test_heldout_preset(gen: ModuleType) -> None:
    s = gen.generate(0, level="heldout")
    params = s.space_data["parameters"]
    assert s.name == "gen-heldout-0" and len(params) == 6
    assert sum(spec["type"] == "categorical" for spec in params.values()) >= 2
    assert "needle2" in s.recipe.p and not s.space_data.get("forbidden")
    for config, _, _ in _draws(s, 50):
        assert s.noise_sigma(config) == 0.03
    lo, hi = gen.BANDS["heldout"]
    assert lo <= s.needle_fraction <= hi


@pytest.mark.parametrize("name", [*ONE_OF_EACH, "gen-heldout-1"])
def test_perturb_is_an_engine_upgrade(gen: ModuleType, name: str) -> None:
    s = gen.by_name(name)
    up = gen.perturb(s, 1)
    assert up.name == f"{name}-up1" and gen.by_name(up.name) == up == gen.perturb(s, 1)
    assert gen.perturb(s, 2) != up
    parse_space(copy.deepcopy(up.space_data), file=f"<{up.name}>")
    assert set(up.space_data["parameters"]) == set(s.space_data["parameters"])
    old_best = up.evaluate(s.optimum_config)  # the earlier study's best: good, not exact
    assert old_best.failure is None
    assert old_best.value != s.optimum
    assert 0.5 * up.optimum <= old_best.value < up.optimum
    assert up.optimum_config != s.optimum_config
    assert up.evaluate(up.optimum_config).value == up.optimum
    for _, forbidden, result in _draws(up, 300):
        if not forbidden and result.failure is None:
            assert result.value <= up.optimum
    assert 0 < up.needle_fraction < 0.2
    assert up.evaluate(up.space.baseline_config()).failure is None


def test_run_one_on_a_generated_surface(harness: ModuleType) -> None:
    surface = harness.load_surface("gen-medium-1")
    assert surface.level == "medium" and surface.needle_fraction is not None
    assert surface.noise_sigma is not None
    for sampler in ("tpe", "random"):
        run = harness.run_one(surface, sampler, 3, 15, surface_noise=True)
        assert len(run.kinds) == 15 and run.kinds[0] == "launch"  # the baseline
        assert run.forbidden_launched == 0
        assert 0 < run.incumbent[-1] <= surface.optimum
    plain = harness.load_surface("gemm-kernel")
    assert plain.level is None and plain.needle_fraction is None and plain.noise_sigma is None


def test_report_carries_level_and_needle_fraction(harness: ModuleType) -> None:
    runs = harness.run_all(["gen-easy-1"], ["random"], [1], 8, surface_noise=True)
    report = harness.build_report(
        runs,
        trials=8,
        seeds=[1],
        noise=0.0,
        objective="throughput",
        odds_draws=0,
        surface_noise=True,
    )
    info = report["surfaces"]["gen-easy-1"]
    assert info["level"] == "easy" and 0.01 <= info["needle_fraction"] <= 0.05
    assert report["surface_noise"] is True
    assert "easy, needle fraction" in harness.markdown(report)


def test_the_shortfall_splits_exactly_into_block_deficits(fam: list[Any]) -> None:
    """benchmarks/deficit_by_block.py's premise: log(optimum / value) is the sum of the three
    blocks' deficits, zero at the optimum, none negative."""
    for s in fam:
        assert s.block_deficits(s.optimum_config) == pytest.approx([0, 0, 0], abs=1e-9)
        base = s.space.baseline_config()
        deficits = s.block_deficits(base)
        assert min(deficits) >= -1e-9
        assert sum(deficits) == pytest.approx(math.log(s.optimum / s.baseline_value), rel=1e-9)
