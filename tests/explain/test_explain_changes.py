"""ChangeSet: what the winner changed from the baseline, and the configurations in between.

Small spaces written to files and loaded like any other; no Optuna, no servers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from explain_spaces import env_lever, make_space

from autotune.explain import ChangeSet
from autotune.space import SearchSpace, load_space


def _changes(space: SearchSpace, winner: Mapping[str, object]) -> ChangeSet:
    return ChangeSet(space, baseline=space.baseline_params(), winner=winner)


# --------------------------------------------------------------------------- plain levers


@pytest.fixture()
def plain(tmp_path: Path) -> SearchSpace:
    return make_space(
        tmp_path,
        {
            "alpha": env_lever("alpha", type="categorical", choices=["x", "y", "z"]),
            "batch": env_lever("batch", type="int", low=1, high=64),
            "cache": env_lever("cache", type="bool"),
            "frac": env_lever("frac", type="float", low=0.5, high=0.95, step=0.05),
            "quiet": env_lever("quiet", type="bool"),
        },
        baseline={"alpha": "x", "batch": 8, "cache": False, "frac": 0.8, "quiet": False},
    )


def test_one_change_per_changed_lever_in_declaration_order(plain: SearchSpace) -> None:
    # given out of declaration order, with two levers at their baseline value
    winner = {"quiet": False, "frac": 0.9, "batch": 8, "cache": True, "alpha": "z"}
    cs = _changes(plain, winner)
    assert cs.names == ("alpha", "cache", "frac")  # batch and quiet unchanged: absent
    alpha, cache, frac = cs.changes
    assert (alpha.levers, dict(alpha.baseline), dict(alpha.winner)) == (
        ("alpha",),
        {"alpha": "x"},
        {"alpha": "z"},
    )
    assert (dict(cache.baseline), dict(cache.winner)) == ({"cache": False}, {"cache": True})
    assert dict(frac.winner) == {"frac": 0.9}
    assert all(c.why_grouped is None for c in cs.changes)
    assert cs.change("cache") is cache
    assert frac.describe() == "frac: 0.8 -> 0.9"


def test_reverting_one_plain_change_reverts_that_lever_only(plain: SearchSpace) -> None:
    cs = _changes(plain, {"alpha": "z", "batch": 32, "cache": True, "frac": 0.8, "quiet": False})
    variant, reverted, note = cs.revert_alone("batch")
    assert reverted == ("batch",) and note is None
    assert variant.applied == frozenset({"alpha", "cache"})
    assert variant.config == {**cs.winner_config, "batch": 8}
    assert variant.key == plain.config_key(variant.config)


def test_no_change_and_every_change_are_the_baseline_and_the_winner(plain: SearchSpace) -> None:
    winner = {"alpha": "y", "batch": 2, "cache": True, "frac": 0.55, "quiet": True}
    cs = _changes(plain, winner)
    base, win = cs.variant([]), cs.variant(cs.names)
    assert base.config == plain.baseline_config() == cs.baseline_config
    assert base.key == plain.config_key(plain.baseline_config())
    assert win.config == plain.complete(winner) == cs.winner_config
    assert win.key == plain.config_key(winner)
    assert base.refused is None and win.refused is None
    assert cs.without([]).key == win.key and cs.without(cs.names).key == base.key
    with pytest.raises(KeyError):
        cs.variant(["nope"])


def test_the_baseline_as_winner_has_no_changes(plain: SearchSpace) -> None:
    cs = _changes(plain, plain.baseline_params())
    assert cs.changes == () and cs.variant([]).key == plain.config_key(plain.baseline_config())


# --------------------------------------------------------------------------- conditions


@pytest.fixture()
def conditional(tmp_path: Path) -> SearchSpace:
    return make_space(
        tmp_path,
        {
            "proto": env_lever("proto", type="categorical", choices=["a", "b"]),
            "spec": env_lever("spec", type="categorical", choices=["off", "eagle"]),
            # active only with eagle: inactive in the baseline
            "steps": env_lever("steps", type="int", low=1, high=4, when="spec == 'eagle'"),
            "graphs": env_lever("graphs", type="bool"),
            # active only with graphs: the winner turns graphs off, so it is inactive there
            "graph_bs": env_lever("graph_bs", type="int", low=1, high=64, when="graphs"),
        },
        baseline={"proto": "a", "spec": "off", "graphs": True, "graph_bs": 16},
    )


WINNER = {"proto": "b", "spec": "eagle", "steps": 3, "graphs": False}


def test_a_child_inactive_in_the_baseline_travels_with_its_parent(
    conditional: SearchSpace,
) -> None:
    cs = _changes(conditional, WINNER)
    assert cs.names == ("proto", "spec + steps", "graphs + graph_bs")
    spec = cs.change("spec + steps")
    assert spec.levers == ("spec", "steps")  # declaration order, the parent first
    assert dict(spec.baseline) == {"spec": "off"}  # steps has no baseline value
    assert dict(spec.winner) == {"spec": "eagle", "steps": 3}
    assert spec.why_grouped is not None
    assert "steps is inactive in the baseline" in spec.why_grouped
    assert "spec == 'eagle'" in spec.why_grouped
    assert spec.describe() == "spec: 'off' -> 'eagle', steps: (inactive) -> 3"

    variant, reverted, note = cs.revert_alone("spec + steps")
    assert reverted == ("spec + steps",) and note is None
    assert variant.config is not None
    assert variant.config["spec"] == "off" and "steps" not in variant.config  # both reverted
    assert variant.config["proto"] == "b" and variant.config["graphs"] is False  # the rest not


def test_a_baseline_lever_the_winner_makes_inactive_travels_with_its_parent(
    conditional: SearchSpace,
) -> None:
    cs = _changes(conditional, WINNER)
    graphs = cs.change("graphs + graph_bs")
    assert dict(graphs.baseline) == {"graphs": True, "graph_bs": 16}
    assert dict(graphs.winner) == {"graphs": False}  # graph_bs is inactive in the winner
    assert graphs.why_grouped is not None
    assert "graph_bs is inactive in the winner (when: graphs)" in graphs.why_grouped
    assert graphs.describe() == "graphs: True -> False, graph_bs: 16 -> (inactive)"

    variant, _, _ = cs.revert_alone("graphs + graph_bs")
    assert variant.config is not None
    assert variant.config["graphs"] is True and variant.config["graph_bs"] == 16  # it came back
    assert variant.config["spec"] == "eagle" and variant.config["steps"] == 3
    # and the other way round: the baseline with only that change
    only = cs.variant(["graphs + graph_bs"])
    assert only.config == {"proto": "a", "spec": "off", "graphs": False}


def test_a_child_active_on_both_sides_is_a_change_of_its_own(conditional: SearchSpace) -> None:
    cs = ChangeSet(
        conditional,
        baseline=conditional.baseline_params(),
        winner={"proto": "a", "spec": "off", "graphs": True, "graph_bs": 32},
    )
    assert cs.names == ("graph_bs",) and cs.changes[0].why_grouped is None


def test_a_derived_value_in_a_condition_is_expanded_to_its_sampled_sources(
    tmp_path: Path,
) -> None:
    space = make_space(
        tmp_path,
        {
            "other": env_lever("other", type="bool"),
            "scale": env_lever("scale", type="int", low=1, high=4),
            "width": {"derived": "scale * 2", "target": {"env": "WIDTH"}},
            "wide_kernels": env_lever("wide_kernels", type="bool", when="width > 4"),
        },
        baseline={"other": False, "scale": 1},
    )
    cs = _changes(space, {"other": True, "scale": 3, "wide_kernels": True})
    assert cs.names == ("other", "scale + wide_kernels")
    change = cs.change("scale + wide_kernels")
    assert (
        change.why_grouped
        == "wide_kernels is inactive in the baseline (and has no default) (when: width > 4)"
    )
    variant, _, _ = cs.revert_alone("scale + wide_kernels")
    assert variant.config == {"other": True, "scale": 1, "width": 2}


def test_a_derived_value_active_under_its_own_condition_groups_that_condition_too(
    tmp_path: Path,
) -> None:
    # `depth` is derived from `x`, but exists only when `deep`: a lever whose condition
    # reads `depth` depends on `deep` as well (x is the same on both sides here)
    space = make_space(
        tmp_path,
        {
            "x": env_lever("x", type="int", low=1, high=4),
            "deep": env_lever("deep", type="bool"),
            "depth": {"derived": "x", "when": "deep"},
            "tune": env_lever("tune", type="bool", when="depth > 0"),
        },
        baseline={"x": 1, "deep": False},
    )
    cs = _changes(space, {"x": 1, "deep": True, "tune": True})
    assert cs.names == ("deep + tune",)
    variant, _, _ = cs.revert_alone("deep + tune")
    assert variant.key == space.config_key(space.baseline_config())  # not the winner again


def test_a_chain_of_conditions_is_one_change(tmp_path: Path) -> None:
    space = make_space(
        tmp_path,
        {
            "p": env_lever("p", type="bool"),
            "q": env_lever("q", type="bool", when="p"),
            "r": env_lever("r", type="int", low=1, high=3, when="q"),
        },
        baseline={"p": False},
    )
    cs = _changes(space, {"p": True, "q": True, "r": 2})
    assert cs.names == ("p + q + r",)
    assert cs.revert_alone("p + q + r")[0].config == {"p": False}


# --------------------------------------------------------------------------- forbidden rules


def test_a_forbidden_revert_is_paired_with_another_change(tmp_path: Path) -> None:
    # the fast kernel needs the new layout: reverting the layout alone is forbidden
    space = make_space(
        tmp_path,
        {
            "extra": env_lever("extra", type="bool"),
            "kernel": env_lever("kernel", type="categorical", choices=["slow", "fast"]),
            "layout": env_lever("layout", type="categorical", choices=["old", "new"]),
        },
        forbidden=[
            {
                "name": "fast_needs_new_layout",
                "when": "kernel == 'fast' and layout == 'old'",
                "reason": "the fast kernel reads the new layout only",
            }
        ],
        baseline={"extra": False, "kernel": "slow", "layout": "old"},
    )
    cs = _changes(space, {"extra": True, "kernel": "fast", "layout": "new"})
    assert cs.names == ("extra", "kernel", "layout")  # a rule does not group

    alone = cs.without(["layout"])
    assert alone.config is None and alone.key is None
    assert alone.refused is not None and "fast_needs_new_layout" in alone.refused

    variant, reverted, note = cs.revert_alone("layout")
    # `extra` is tried first (declaration order) and is still forbidden; `kernel` works
    assert reverted == ("layout", "kernel")
    assert variant.config == {"extra": True, "kernel": "slow", "layout": "old"}
    assert note is not None
    assert note.startswith("reverting layout alone is refused (forbidden combination")
    assert "fast_needs_new_layout" in note and note.endswith("reverted together with kernel")

    # the other direction is allowed alone: slow kernel, new layout
    variant, reverted, note = cs.revert_alone("kernel")
    assert reverted == ("kernel",) and note is None and variant.config is not None


def test_a_revert_no_pair_rescues_is_refused(tmp_path: Path) -> None:
    # without `core` the deployment runs only as the baseline: no single change may stay
    space = make_space(
        tmp_path,
        {
            "core": env_lever("core", type="bool"),
            "left": env_lever("left", type="bool"),
            "right": env_lever("right", type="bool"),
        },
        forbidden=[
            {
                "name": "extras_need_core",
                "when": "not core and (left or right)",
                "reason": "left and right need core",
            }
        ],
        baseline={"core": False, "left": False, "right": False},
    )
    cs = _changes(space, {"core": True, "left": True, "right": True})
    variant, reverted, note = cs.revert_alone("core")
    assert variant.config is None and variant.key is None and reverted == ("core",)
    assert variant.refused is not None and "extras_need_core" in variant.refused
    assert note is not None and note.startswith("cannot be reverted: ")
    assert "extras_need_core" in note
    # the others revert alone
    assert cs.revert_alone("left")[0].config == {"core": True, "left": False, "right": True}


def test_a_mix_that_activates_a_lever_neither_side_sets_is_refused_then_paired(
    tmp_path: Path,
) -> None:
    space = make_space(
        tmp_path,
        {
            "s": env_lever("s", type="bool"),
            "t": env_lever("t", type="bool"),
            "both": env_lever("both", type="int", low=1, high=4, when="s and t"),
        },
        baseline={"s": False, "t": True},
    )
    cs = _changes(space, {"s": True, "t": False})  # `both` inactive on either side
    assert cs.names == ("s", "t")
    alone = cs.without(["t"])
    assert alone.config is None and alone.refused is not None and "both" in alone.refused
    variant, reverted, note = cs.revert_alone("t")
    assert reverted == ("t", "s") and variant.key == space.config_key(space.baseline_config())
    assert note is not None and "reverted together with s" in note


# --------------------------------------------------------------------------- engine defaults


@pytest.fixture()
def defaulted(tmp_path: Path) -> SearchSpace:
    return make_space(
        tmp_path,
        {
            "engine": env_lever("engine", type="bool"),
            # inactive in the baseline (engine off) but with the engine's own value stated
            "block": env_lever(
                "block", type="categorical", choices=[16, 64, 256], when="engine", default=256
            ),
            "graphs": env_lever("graphs", type="bool", when="engine", default=False),
            # inactive in the baseline, no default: goes with engine
            "frac": env_lever("frac", type="float", low=0.5, high=0.9, step=0.1, when="engine"),
        },
        baseline={"engine": False},
    )


def test_a_child_inactive_in_the_baseline_with_a_default_is_its_own_change(
    defaulted: SearchSpace,
) -> None:
    cs = _changes(defaulted, {"engine": True, "block": 64, "graphs": True, "frac": 0.7})
    assert cs.names == ("engine + frac", "block", "graphs")
    block = cs.change("block")
    assert dict(block.baseline) == {"block": 256} and dict(block.winner) == {"block": 64}
    assert block.defaulted == ("block",) and block.why_grouped is None
    assert block.describe() == "block: 256 (default) -> 64"
    assert cs.change("graphs").describe() == "graphs: False (default) -> True"
    engine = cs.change("engine + frac")
    assert engine.defaulted == ()  # frac has no default: nothing to revert it to
    assert dict(engine.baseline) == {"engine": False}
    assert engine.describe() == "engine: False -> True, frac: (inactive) -> 0.7"
    assert engine.why_grouped is not None
    assert "frac is inactive in the baseline (and has no default) (when: engine)" in (
        engine.why_grouped
    )


def test_reverting_a_defaulted_change_sets_the_default_and_keeps_its_parent(
    defaulted: SearchSpace,
) -> None:
    cs = _changes(defaulted, {"engine": True, "block": 64, "graphs": True, "frac": 0.7})
    variant, reverted, note = cs.revert_alone("block")
    assert reverted == ("block",) and note is None
    assert variant.config == {"engine": True, "block": 256, "graphs": True, "frac": 0.7}
    assert variant.key == defaulted.config_key(variant.config)
    # the parent reverted: every child goes inactive with it, defaulted or not
    variant, _, _ = cs.revert_alone("engine + frac")
    assert variant.config == {"engine": False}
    # the baseline plus the parent only: the defaulted children at their defaults
    only = cs.variant(["engine + frac"])
    assert only.config == {"engine": True, "block": 256, "graphs": False, "frac": 0.7}


def test_a_winner_value_equal_to_the_default_is_no_change(defaulted: SearchSpace) -> None:
    cs = _changes(defaulted, {"engine": True, "block": 256, "graphs": False, "frac": 0.5})
    assert cs.names == ("engine + frac",)
    assert cs.change("engine + frac").levers == ("engine", "frac")
    assert cs.variant(cs.names).config == cs.winner_config


def test_a_defaulted_lever_inactive_on_both_sides_is_no_change(defaulted: SearchSpace) -> None:
    # the engine's own value on both sides: nothing to revert
    assert _changes(defaulted, defaulted.baseline_params()).changes == ()
    cs = _changes(defaulted, {"engine": False})
    assert cs.names == () and cs.variant([]).key == cs.variant(cs.names).key


def test_a_lever_without_default_goes_with_the_last_declared_lever_its_condition_names(
    tmp_path: Path,
) -> None:
    space = make_space(
        tmp_path,
        {
            "a": env_lever("a", type="bool"),
            "b": env_lever("b", type="bool"),
            "both": env_lever("both", type="int", low=1, high=4, when="a and b"),
        },
        baseline={"a": False, "b": False},
    )
    cs = _changes(space, {"a": True, "b": True, "both": 2})
    assert cs.names == ("a", "b + both")  # not one "a + b + both": only the nearest
    assert cs.change("a").why_grouped is None
    assert cs.change("b + both").why_grouped == (
        "both is inactive in the baseline (and has no default) (when: a and b)"
    )
    # reverting either parent makes `both` inactive: each revert runs on its own
    assert cs.revert_alone("a")[0].config == {"a": False, "b": True}
    assert cs.revert_alone("b + both")[0].config == {"a": True, "b": False}


# --------------------------------------------------------------------------- transformers serve

H200_WINNER: dict[str, object] = {
    "continuous_batching": True,
    "attn_implementation": "eager",
    "dtype": "auto",
    "cb_cuda_graph": True,
    "cb_block_size": 256,
    "cb_kv_manual": True,
    "cb_kv_tokens": 4621,
    "cb_max_batch_tokens": 256,
    "cb_max_memory_percent": 0.8,
}


@pytest.fixture(scope="module")
def transformers_serve() -> SearchSpace:
    return load_space(Path(__file__).resolve().parents[2] / "search_spaces/transformers-serve.yaml")


def test_the_h200_transformers_serve_winner_changes(transformers_serve: SearchSpace) -> None:
    cs = _changes(transformers_serve, H200_WINNER)
    assert cs.names == (
        "continuous_batching + compile + cb_max_memory_percent",
        "attn_implementation",
        "cb_cuda_graph",
        "cb_kv_manual + cb_kv_tokens",
        "cb_max_batch_tokens",
    )  # cb_block_size 256 is its default: no change
    described = {c.name: c.describe() for c in cs.changes}
    assert described == {
        "continuous_batching + compile + cb_max_memory_percent": (
            "continuous_batching: False -> True, compile: False -> (inactive), "
            "cb_max_memory_percent: (inactive) -> 0.8"
        ),
        "attn_implementation": "attn_implementation: 'default' -> 'eager'",
        "cb_cuda_graph": "cb_cuda_graph: False (default) -> True",
        "cb_kv_manual + cb_kv_tokens": (
            "cb_kv_manual: False (default) -> True, cb_kv_tokens: (inactive) -> 4621"
        ),
        "cb_max_batch_tokens": "cb_max_batch_tokens: 'auto' (default) -> 256",
    }
    assert cs.change("cb_kv_manual + cb_kv_tokens").defaulted == ("cb_kv_manual",)


def test_a_winner_without_continuous_batching_changes_only_what_it_sets(
    transformers_serve: SearchSpace,
) -> None:
    # every cb_* lever is inactive on both sides: none is a change, defaulted or not
    assert _changes(transformers_serve, transformers_serve.baseline_params()).changes == ()
    winner = {
        "continuous_batching": False,
        "attn_implementation": "eager",
        "compile": True,
        "dtype": "bfloat16",
    }
    cs = _changes(transformers_serve, winner)
    assert cs.names == ("attn_implementation", "compile", "dtype")
    assert all(c.defaulted == () and c.why_grouped is None for c in cs.changes)


def test_every_h200_change_reverts_alone_to_a_runnable_configuration(
    transformers_serve: SearchSpace,
) -> None:
    cs = _changes(transformers_serve, H200_WINNER)
    win = cs.winner_config
    manual = {k: v for k, v in win.items() if k not in ("cb_kv_tokens", "cb_num_blocks")}
    expected = {
        # continuous batching off: every cb_* lever inactive, compile back (at False)
        "continuous_batching + compile + cb_max_memory_percent": {
            "continuous_batching": False,
            "attn_implementation": "eager",
            "compile": False,
            "dtype": "auto",
        },
        "attn_implementation": {**win, "attn_implementation": "default"},
        "cb_cuda_graph": {**win, "cb_cuda_graph": False},
        # manual KV off (its default): no KV tokens, so no --cb-num-blocks either
        "cb_kv_manual + cb_kv_tokens": {**manual, "cb_kv_manual": False},
        "cb_max_batch_tokens": {**win, "cb_max_batch_tokens": "auto"},
    }
    assert set(expected) == set(cs.names)
    for name, config in expected.items():
        variant, reverted, note = cs.revert_alone(name)
        assert (reverted, note, variant.refused) == ((name,), None, None), name
        assert variant.config == config, name
    assert cs.variant([]).config == transformers_serve.baseline_config()
