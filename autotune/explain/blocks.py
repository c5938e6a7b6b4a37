"""An explanation's runs read with the GPU as a block, where they span GPUs.

Why: GPU machines are lent a session at a time, so an explanation resumed in a new session,
and the runs it borrows from a check study, come from other GPUs than its first runs. The
planner keeps the runs of GPUs that read within the noise of each other
(:mod:`autotune.explain.occasions`) and pools them; but a few percent between GPUs that is
within the noise still moves a small change's contribution by as much (the dense 7B winner
on four H100s up to 4.1% apart: its five small changes read -0.1..-2.2% pooled, -0.1..+1.2%
with the GPU as a block), and an occasions check with a wide interval cannot rule out a
drift the size of a large change (the MoE winner's fp8 weights after one H100: +11.5%
pooled, +8.7% with its interval across zero when only the runs beside each other count; the
2 restarts on a second H100 that decided it, +11.5% (+4.4..+18.1%), were planned from that).

The model: ``log(run) = configuration + GPU + noise``, fitted by least squares over every
stored run of the explanation (its own and the borrowed), each configuration a level, each
GPU but the first an offset. A change's share (``1 - without / winner``, the share column's
meaning) then rests only on comparisons within a GPU, linked across GPUs through the
configurations they share; where no chain of shared GPUs links the two, there is none. The
noise is pooled from the residuals, ``n - rank`` degrees of freedom. A second reading beside
the planner's, not a replacement: the planner decides what to measure; this says what the
runs show once the GPUs are taken out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.explain.record import ExplainRun, Explanation, Interval
from autotune.results import t_quantile
from autotune.telemetry import short_machine


@dataclass(frozen=True)
class BlockFit:
    """The two-way fit of :func:`fit_blocks`."""

    keys: list[str]
    """The configurations, in the order of the coefficients."""
    gpus: list[str]
    """The GPUs, sorted; the first is the reference level."""
    beta: np.ndarray
    """Each configuration's log level (at the first GPU), then each other GPU's offset."""
    design: np.ndarray
    xtx_pinv: np.ndarray
    sigma: float
    """The run-to-run noise left once the GPUs are taken out (a log: about a fraction)."""
    df: int

    def ratio(self, a: str, b: str) -> tuple[float, float | None] | None:
        """``log(a / b)`` and the half-width of its 95% interval (None: no df left); None
        where the runs do not fix it (no chain of shared GPUs links ``a`` to ``b``)."""
        c = np.zeros(self.beta.shape[0])
        c[self.keys.index(a)], c[self.keys.index(b)] = 1.0, -1.0
        # estimable iff c lies in the design's row space
        if np.abs(c - c @ self.xtx_pinv @ self.design.T @ self.design).max() > 1e-8:
            return None
        delta = float(c @ self.beta)
        if self.df < 1:
            return delta, None
        se = self.sigma * math.sqrt(float(c @ self.xtx_pinv @ c))
        return delta, t_quantile(0.95, self.df) * se

    def gpu_offsets(self) -> dict[str, float]:
        """Each GPU's level against the first's, as a fraction (``0.041``: 4.1% faster)."""
        first = len(self.keys)
        return {self.gpus[0]: 0.0} | {
            g: math.exp(float(self.beta[first + i])) - 1 for i, g in enumerate(self.gpus[1:])
        }


def fit_blocks(runs: Sequence[tuple[str, str | None, float]]) -> BlockFit | None:
    """The two-way fit of ``(configuration key, GPU, value)`` runs (on one GPU, the plain
    one-way fit); None where a run has no GPU or no positive value."""
    if not runs or any(g is None or v <= 0 for _, g, v in runs):
        return None
    keys = sorted({k for k, _, _ in runs})
    gpus = sorted({str(g) for _, g, _ in runs})
    x = np.zeros((len(runs), len(keys) + len(gpus) - 1))
    y = np.array([math.log(v) for _, _, v in runs])
    for i, (k, g, _) in enumerate(runs):
        x[i, keys.index(k)] = 1.0
        if (j := gpus.index(str(g))) > 0:
            x[i, len(keys) + j - 1] = 1.0
    xtx_pinv = np.linalg.pinv(x.T @ x)
    beta = xtx_pinv @ x.T @ y
    df = len(runs) - int(np.linalg.matrix_rank(x))
    resid = y - x @ beta
    sigma = math.sqrt(float(resid @ resid) / df) if df > 0 else 0.0
    return BlockFit(keys, gpus, beta, x, xtx_pinv, sigma, df)


@dataclass(frozen=True)
class GpuBlocks:
    """An explanation read with the GPU as a block (:func:`gpu_blocked`)."""

    fit: BlockFit
    shares: dict[str, Interval | None]
    """Per change (:attr:`Effect.change`): ``1 - without / winner``, its 95% interval; None
    where it cannot be read (:attr:`unread` says why)."""
    unread: dict[str, str]
    """Per change not read: ``not measured`` (the winner without it has no run with a
    value: it failed to start) or ``not linked by a shared GPU``."""

    def share_text(self, change: str) -> str:
        """``+23.2% (+21.0% to +25.4%)``, or why it cannot be read."""
        share = self.shares.get(change)
        if share is None:
            return self.unread.get(change, "not measured")
        text = f"{100 * share.value:+.1f}%"
        if share.low is not None and share.high is not None:
            text += f" ({100 * share.low:+.1f}% to {100 * share.high:+.1f}%)"
        return text

    def describe(self) -> str:
        offsets = ", ".join(
            f"{short_machine(g)} {100 * o:+.1f}%" for g, o in self.fit.gpu_offsets().items()
        )
        return (
            f"with the GPU as a block ({len(self.fit.gpus)} GPUs: {offsets}): run-to-run noise "
            f"{100 * self.fit.sigma:.1f}%, {self.fit.df} df"
        )


def gpu_blocked(e: Explanation, runs: Mapping[str, Sequence[ExplainRun]]) -> GpuBlocks | None:
    """Each change of ``e`` from every stored run (``load_runs``), the GPU as a block; None
    where the runs ran on one GPU or one does not say which (no GPU telemetry)."""
    fit = fit_blocks(
        [(key, r.machine, r.value) for key, rs in runs.items() for r in rs if r.value is not None]
    )
    winner = e.winner_measured.key
    if fit is None or len(fit.gpus) < 2 or winner is None or winner not in fit.keys:
        return None  # on one GPU there is nothing to take out
    shares: dict[str, Interval | None] = {}
    unread: dict[str, str] = {}
    for x in e.effects:
        without = x.without.key
        read = None if without not in fit.keys else fit.ratio(winner, str(without))
        if read is None:
            shares[x.change] = None
            unread[x.change] = (
                "not measured" if without not in fit.keys else "not linked by a shared GPU"
            )
            continue
        delta, half = read  # log(winner / without): the share is 1 - exp(-delta)
        shares[x.change] = Interval(
            value=-math.expm1(-delta),
            low=None if half is None else -math.expm1(half - delta),
            high=None if half is None else -math.expm1(-delta - half),
        )
    return GpuBlocks(fit, shares, unread)
