"""benchmarks/gpu_gain.py: the gain of one configuration over another when their runs were
measured on several GPUs, the GPU taken as a block, checked against a least-squares fit of
the two-way model; a shift between GPUs that the plain ratio of means carries is removed."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from autotune.explain.blocks import fit_blocks
from autotune.results import t_quantile
from benchmarks.gpu_gain import gain, gpu_adjusted, on_one_gpu


def _lstsq(
    a: list[float], ga: list[str], b: list[float], gb: list[str]
) -> tuple[float, float, float, int]:
    """log(run) = gain * [side a] + GPU, fitted by numpy: (gain, low, high) in % and df."""
    blocks = sorted(set(ga) | set(gb))
    rows, y = [], []
    for side, values, gpus in ((1.0, a, ga), (0.0, b, gb)):
        for v, g in zip(values, gpus, strict=True):
            rows.append([side] + [float(g == block) for block in blocks])
            y.append(math.log(v))
    x, yv = np.array(rows), np.array(y)
    beta = np.linalg.lstsq(x, yv, rcond=None)[0]
    df = len(yv) - x.shape[1]
    resid = yv - x @ beta
    se = math.sqrt(float(resid @ resid) / df * np.linalg.inv(x.T @ x)[0, 0])
    half = t_quantile(0.95, df) * se
    pct = [100 * (math.exp(v) - 1) for v in (beta[0], beta[0] - half, beta[0] + half)]
    return pct[0], pct[1], pct[2], df


def _draw(seed: int) -> tuple[list[float], list[str], list[float], list[str], list[str]]:
    """Runs of two configurations on 2-4 GPUs: one GPU measured both sides at least once,
    and one degree of freedom is left; (a, a's GPUs, b, b's GPUs, the GPUs)."""
    rng = random.Random(seed)
    gpus = [f"GPU-{i:08x}-aaaa" for i in range(rng.randint(2, 4))]
    a = [rng.uniform(5.0, 6.0) for _ in range(rng.randint(2, 5))]
    b = [rng.uniform(4.0, 5.0) for _ in range(rng.randint(2, 5))]
    ga = [rng.choice(gpus) for _ in a]
    gb = [rng.choice(gpus) for _ in b]
    ga[0] = gb[0] = gpus[0]
    if len(a) + len(b) - len(set(ga) | set(gb)) - 1 < 1:
        a.append(5.5)
        ga.append(gpus[0])
    return a, ga, b, gb, gpus


@pytest.mark.parametrize("seed", range(8))
def test_the_block_estimate_is_the_least_squares_fit(seed: int) -> None:
    a, ga, b, gb, _ = _draw(seed)
    text = gpu_adjusted(a, ga, b, gb)
    centre, low, high, df = _lstsq(a, ga, b, gb)
    assert text == (
        f"{centre:+.1f}% (95% CI {low:+.1f} to {high:+.1f}%; {len(a) + len(b)} runs on "
        f"{len(set(ga) | set(gb))} GPUs, {df} df)"
    )


def test_a_shift_between_gpus_is_not_taken_for_a_gain() -> None:
    """Configuration a serves 10% more than b on each GPU; the second GPU is 30% slower and
    measured most of a's runs: the plain ratio reads a loss, the block estimate +10%."""
    fast, slow = "GPU-aaaaaaaa-1", "GPU-bbbbbbbb-2"
    jitter = [1.0, 1.01, 0.99]
    a = [110.0 * jitter[0], 77.0 * jitter[1], 77.0 * jitter[2], 77.0]
    ga = [fast, slow, slow, slow]
    b = [100.0 * jitter[0], 100.0 * jitter[2], 70.0 * jitter[1]]
    gb = [fast, fast, slow]
    assert gain(a, b).startswith("-")
    text = gpu_adjusted(a, ga, b, gb)
    assert text is not None
    centre = float(text.split("%")[0])
    low, high = (float(x) for x in text.split("CI ")[1].split("%")[0].split(" to "))
    assert 9.0 < centre < 11.0 and low < 10.0 < high and low > 0.0


def test_no_block_estimate_without_a_gpu_that_measured_both() -> None:
    a, b = "GPU-aaaaaaaa-1", "GPU-bbbbbbbb-2"
    assert gpu_adjusted([10.0, 11.0], [a, a], [5.0, 6.0], [b, b]) is None
    assert gpu_adjusted([10.0, 11.0], [a, None], [5.0, 6.0], [a, a]) is None
    assert on_one_gpu([10.0], [a], [5.0], [b]) is None
    # one run of each side on one GPU, a third on another: no residual left for an interval
    assert gpu_adjusted([10.0, 9.0], [a, b], [5.0], [a]) == (
        "+100.0% (3 runs on 2 GPUs, no degrees of freedom left for an interval)"
    )


def test_one_gpu_is_the_one_whose_smaller_side_is_larger() -> None:
    a, b = "GPU-aaaaaaaa-1", "GPU-bbbbbbbb-2"
    # a: 3 runs against 1, b: 1 against 2; the smaller sides tie, a has more runs
    assert on_one_gpu([1.0, 2.0, 3.0, 4.0], [a, a, a, b], [5.0, 6.0, 7.0], [a, b, b]) == (
        a,
        [1.0, 2.0, 3.0],
        [5.0],
    )
    # a: 4 runs against 1, b: 2 against 2: b compares two with two
    assert on_one_gpu([1.0, 2.0, 3.0, 4.0, 8.0, 9.0], [a, a, a, a, b, b], [5.0, 6.0, 7.0],
                      [a, b, b]) == (b, [8.0, 9.0], [6.0, 7.0])  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_the_fit_of_many_configurations_reads_two_as_the_closed_form(seed: int) -> None:
    """fit_blocks over the runs of two configurations gives gpu_adjusted's estimate and
    interval; a third configuration on the same GPUs adds its runs' scatter to the noise
    and its degrees of freedom, and leaves the two's estimate alone when it sits on one
    GPU (it fixes nothing about the others)."""
    a, ga, b, gb, gpus = _draw(seed)
    runs = [("a", g, v) for v, g in zip(a, ga, strict=True)]
    runs += [("b", g, v) for v, g in zip(b, gb, strict=True)]
    fit = fit_blocks(runs)
    assert fit is not None
    read = fit.ratio("a", "b")
    assert read is not None
    delta, half = read
    assert half is not None
    text = (
        f"{100 * (math.exp(delta) - 1):+.1f}% (95% CI {100 * (math.exp(delta - half) - 1):+.1f}"
        f" to {100 * (math.exp(delta + half) - 1):+.1f}%; {len(runs)} runs on {len(fit.gpus)} "
        f"GPUs, {fit.df} df)"
    )
    assert text == gpu_adjusted(a, ga, b, gb)
    alone = fit_blocks([*runs, ("c", gpus[-1], 7.0)])
    assert alone is not None and alone.df == fit.df
    again = alone.ratio("a", "b")
    assert again is not None and again[0] == pytest.approx(delta)


def test_configurations_no_shared_gpu_links_are_not_compared() -> None:
    runs = [("a", "x", 10.0), ("a", "x", 11.0), ("b", "y", 5.0), ("b", "y", 6.0)]
    fit = fit_blocks(runs)
    assert fit is not None and fit.ratio("a", "b") is None
    # a third configuration measured on both GPUs links them
    linked = fit_blocks([*runs, ("c", "x", 8.0), ("c", "y", 4.0)])
    assert linked is not None
    read = linked.ratio("a", "b")
    assert read is not None and math.exp(read[0]) == pytest.approx(
        math.sqrt(10.0 * 11.0) / 8.0 / (math.sqrt(5.0 * 6.0) / 4.0)
    )
    assert fit_blocks([("a", None, 1.0), ("b", "x", 1.0)]) is None
    one = fit_blocks([("a", "x", 1.0), ("a", "x", 1.2), ("b", "x", 2.0), ("b", "x", 2.2)])
    assert one is not None and one.gpus == ["x"] and one.df == 2  # the plain one-way fit
    read = one.ratio("a", "b")
    assert read is not None and math.exp(read[0]) == pytest.approx(
        math.sqrt(1.0 * 1.2) / math.sqrt(2.0 * 2.2)
    )
