"""The gain of one configuration over another when their runs were measured on several GPUs.

Why: issue 28's runs on Hopper GPUs are lent a session at a time, and a study resumed in a
new session runs on another GPU; two H100s served vLLM's defaults 17% apart. A gain read
from runs of two configurations spread over GPUs unevenly carries the difference between
the GPUs as if the configuration had bought it. Three readings, each for what it is:

* :func:`gain`: the plain ratio of the means, with a Welch 95% interval (the runs taken as
  one machine's);
* :func:`on_one_gpu`: only the runs of the GPU that measured most of both;
* :func:`gpu_adjusted`: every run, with the GPU as a block: ``log(run) = configuration +
  GPU + noise``, the two-way additive model fitted by least squares
  (:func:`autotune.explain.blocks.fit_blocks`, which ``autotune explain`` reads each change
  of an explanation with). With two configurations its estimate is the mean of the per-GPU
  differences (of log means) weighted by ``n_a n_b / (n_a + n_b)``; ``sigma`` is pooled from
  the residuals, ``n - k - 1`` degrees of freedom for ``k`` GPUs. A GPU that measured one
  side only fixes nothing about the gain and adds only its runs' scatter to ``sigma``.

The readers (``benchmarks/h200_side_by_side.py``) print all three where the runs span GPUs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from autotune.explain.blocks import fit_blocks
from autotune.results import t_quantile

Gpus = Sequence[str | None]


def _pct(log_ratio: float) -> str:
    return f"{100 * (math.exp(log_ratio) - 1):+.1f}"


def gain(values: Sequence[float], reference: Sequence[float]) -> str:
    """``+33.5%``, with a Welch 95% interval when both sides have two measurements or more."""
    if not values or not reference:
        return "-"
    a, b = statistics.fmean(values), statistics.fmean(reference)
    text = f"{100 * (a / b - 1):+.1f}%"
    if len(values) < 2 or len(reference) < 2:
        return text
    va, vb = (
        statistics.variance(values) / len(values),
        statistics.variance(reference) / len(reference),
    )
    se = math.sqrt(va + vb)
    if se == 0:
        return text
    df = (va + vb) ** 2 / (va**2 / (len(values) - 1) + vb**2 / (len(reference) - 1))
    half = t_quantile(0.95, max(1, int(df))) * se
    lo, hi = (a - b - half) / b, (a - b + half) / b
    return f"{text} (95% CI {100 * lo:+.1f} to {100 * hi:+.1f}%)"


def on_one_gpu(
    values: Sequence[float], gpus: Gpus, reference: Sequence[float], ref_gpus: Gpus
) -> tuple[str, list[float], list[float]] | None:
    """The GPU that measured most of both sides (ties: the one whose smaller side is larger,
    then by name), and each side's runs on it; None where no GPU measured both."""
    shared = set(gpus) & set(ref_gpus) - {None}
    if not shared:
        return None
    gpu = max(
        sorted(shared, key=str),
        key=lambda g: (min(gpus.count(g), ref_gpus.count(g)), gpus.count(g) + ref_gpus.count(g)),
    )
    assert gpu is not None
    a = [v for v, g in zip(values, gpus, strict=True) if g == gpu]
    b = [v for v, g in zip(reference, ref_gpus, strict=True) if g == gpu]
    return gpu, a, b


def gpu_adjusted(
    values: Sequence[float], gpus: Gpus, reference: Sequence[float], ref_gpus: Gpus
) -> str | None:
    """The gain of ``values`` over ``reference`` with the GPU as a block (module doc), as
    ``+28.4% (95% CI ... ; 6 runs on 2 GPUs, 3 df)``; None where no GPU measured both sides,
    a run has no GPU or a value is not positive."""
    if None in gpus or None in ref_gpus:
        return None
    fit = fit_blocks(
        [("a", g, v) for v, g in zip(values, gpus, strict=True)]
        + [("b", g, v) for v, g in zip(reference, ref_gpus, strict=True)]
    )
    read = None if fit is None or {"a", "b"} - set(fit.keys) else fit.ratio("a", "b")
    if fit is None or read is None:
        return None
    delta, half = read
    text = _pct(delta) + "%"
    where = f"{len(values) + len(reference)} runs on {len(fit.gpus)} GPUs"
    if half is None:
        return f"{text} ({where}, no degrees of freedom left for an interval)"
    return f"{text} (95% CI {_pct(delta - half)} to {_pct(delta + half)}%; {where}, {fit.df} df)"
