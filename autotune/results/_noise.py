"""Confidence intervals of noisy measurements, as pure arithmetic on numbers.

Student t quantiles (a table, then Cornish-Fisher or the closed form: no SciPy at run time),
a configuration's interval half-width and the conservative lower bound ``best`` ranks by,
and the study's run-to-run noise pooled over repeated measurements. Kept apart from the
trials so the estimates (:mod:`autotune.results._estimates`), the re-measure race
(``autotune.study.race``) and ``autotune explain`` compute every interval by one rule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95% intervals)."""


@functools.lru_cache(maxsize=1024)
def t_quantile(confidence: float, df: int) -> float:
    """The half-width factor of a two-sided ``confidence`` interval with ``df`` degrees of
    freedom (Student t; 0.95 gives :func:`t975`, the table ``best`` has always used).

    Exact for integer degrees of freedom: the t distribution's closed form (Abramowitz and
    Stegun 26.7.3-4) inverted by bisection; no SciPy at run time.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if abs(confidence - 0.95) < 1e-12:
        return t975(df)
    low, high = 0.0, 1.0
    while _t_within(high, df) < confidence:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if _t_within(mid, df) < confidence:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return 0.5 * (low + high)


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (integer) degrees of freedom."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    term = total = 1.0
    if df % 2:
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        tail = s * math.cos(theta) * total if df > 1 else 0.0
        return 2.0 / math.pi * (theta + tail)
    for j in range(1, df // 2):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return s * total


def half_width(
    mean: float, n: int, sd: float | None, df: int, *, confidence: float = 0.95
) -> float | None:
    """Half-width of a configuration's ``confidence`` interval: ``n`` measurements of mean
    ``mean`` with the study's pooled relative noise ``sd`` (``df`` degrees of freedom);
    ``None`` while there is no noise figure."""
    if sd is None or df < 1 or n < 1:
        return None
    return t_quantile(confidence, df) * sd * mean / math.sqrt(n)


def conservative(mean: float, half: float | None) -> float:
    """The lower bound ``best`` ranks by: ``mean - half``, the mean itself without a noise
    figure, never below 0 (see :attr:`ConfigEstimate.lower`)."""
    return max(mean - (half or 0.0), 0.0)


def t975(df: int) -> float:
    """Student t 97.5% quantile (no SciPy at run time: a table, then Cornish-Fisher)."""
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def noise_level(
    groups: Sequence[Sequence[float]], *, widths: Sequence[float] = ()
) -> tuple[float | None, int]:
    """Pooled relative standard deviation of repeated measurements, and its degrees of freedom.

    Relative because the noise is multiplicative (a process runs x% fast or slow), so one
    figure serves every configuration, measured once or many times.

    ``widths``: the relative bracket widths capacity readings were taken from
    (:func:`bracket_width`). Such a value is the bracket's lower end, so with the true
    capacity anywhere in it its SD is ``w / sqrt(12)``; the pooled figure is at least that
    (root-mean-square over the readings). Without it, repeats that land on the same bisection
    point pool to 0 and an interval of zero width: ``best`` claimed 64.0 +- 0 req/s for a
    capacity bracketed by 64.0 and 90.5, and the race stopped as if it were exact.
    """
    ss = 0.0
    df = 0
    for values in groups:
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        if mean <= 0:
            continue
        ss += sum((v / mean - 1.0) ** 2 for v in values)
        df += len(values) - 1
    if not df:
        return None, 0
    sd = math.sqrt(ss / df)
    if widths:
        sd = max(sd, math.sqrt(sum(w * w for w in widths) / len(widths) / 12.0))
    return sd, df
