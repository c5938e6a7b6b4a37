"""Generated surfaces with real-space rule weight (``gen-...-rulesP``,
benchmarks/_sample_efficiency/rules.py) and the launch checkpoints of the harness's report."""

from __future__ import annotations

from types import ModuleType

import pytest
from sampler_helpers import load_harness, quiet_optuna  # noqa: F401

from benchmarks._sample_efficiency.rules import forbidden_share, split_rules

pytestmark = pytest.mark.usefixtures("quiet_optuna")


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return load_harness()


def test_names_and_family_expansion(harness: ModuleType) -> None:
    assert split_rules("gen-hard-3-rules45") == ("gen-hard-3", 45)
    assert split_rules("gen-hard-3") == ("gen-hard-3", None)
    with pytest.raises(SystemExit, match="share P in 1-99"):
        split_rules("gen-hard-3-rules0")
    names = harness.expand_surfaces(["family:3:7:rules50", "family:2"])
    assert names == [
        "gen-easy-7-rules50",
        "gen-medium-7-rules50",
        "gen-hard-7-rules50",
        "gen-easy-0",
        "gen-medium-0",
    ]
    with pytest.raises(SystemExit, match="family:N"):
        harness.expand_surfaces(["family:x:rules50"])


@pytest.mark.parametrize("name", ["gen-easy-5", "gen-medium-6", "gen-hard-7"])
def test_rules_reach_the_share_and_spare_the_optimum_and_the_baseline(
    harness: ModuleType, name: str
) -> None:
    plain = harness.load_surface(name)
    ruled = harness.load_surface(f"{name}-rules50")
    before = forbidden_share(plain.space, seed=11)
    after = forbidden_share(ruled.space, seed=11)  # other draws than the ones that built it
    assert before < 0.2 and 0.45 <= after <= 0.75, (before, after)
    assert not ruled.space.violations(ruled.optimum_config)
    assert not ruled.space.violations(ruled.space.baseline_params())
    assert (ruled.optimum, ruled.optimum_config) == (plain.optimum, plain.optimum_config)
    assert ruled.needle_fraction is None and ruled.level == plain.level
    again = harness.load_surface(f"{name}-rules50")  # seeded: the same rules
    assert [r.name for r in again.space.rules] == [r.name for r in ruled.space.rules]
    assert len(ruled.space.rules) > len(plain.space.rules)


def test_a_run_counts_launches_and_the_report_gives_best_at_launches(
    harness: ModuleType,
) -> None:
    runs = harness.run_all(["gen-medium-2-rules50"], ["tpe", "random"], [1, 2], 40)
    report = harness.build_report(
        runs,
        trials=40,
        seeds=[1, 2],
        noise=0.0,
        objective="throughput",
        odds_draws=200,
        surface_noise=False,
    )
    info = report["surfaces"]["gen-medium-2-rules50"]
    for sampler, figures in info["samplers"].items():
        assert figures["mean"]["forbidden"] > 0, sampler
        assert figures["forbidden_launched"] == 0
        at = figures["best_at_launches"]
        assert set(at) <= {"8", "16", "32"} and "8" in at
        assert at["8"]["of"] == 2 and 0 < at["8"]["median"] <= 100
        if "16" in at:
            assert at["16"]["median"] >= at["8"]["median"] - 1e-9 or at["16"]["runs"] < 2
    table = harness.markdown(report)
    assert "best @16 launches" in table and "medium: " in table
