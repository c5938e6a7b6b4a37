"""Each tool's figures (and its raw data under the others' definitions), the runs, the summary."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.loadgen.records import RequestRecord

from .constants import LABELS, PAIRS, TOOLS
from .loads import due_match, slot_waits

FIGURES = (
    ("output_tok_s", "output tok/s"),
    ("ttft_p50", "TTFT p50 ms"),
    ("ttft_p99", "TTFT p99 ms"),
    ("ttft_p99_after_first_wave", "TTFT p99 ms, requests after the first C"),
    ("tpot_p50", "TPOT p50 ms"),
    ("tpot_p99", "TPOT p99 ms"),
    ("itl_p50", "ITL p50 ms"),
    ("itl_p99", "ITL p99 ms"),
    ("itl_mean", "ITL mean ms"),
    ("e2e_p50", "E2E p50 ms"),
    ("e2e_p99", "E2E p99 ms"),
    ("duration_s", "duration s"),
    ("request_throughput", "request throughput req/s"),
    ("offered_rate", "offered rate req/s, (n - 1) / (last arrival - first)"),
    ("first_arrival_s", "first arrival s after the start"),
    ("send_lag_p50", "send lag p50 ms (arrival behind its schedule)"),
    ("send_lag_p99", "send lag p99 ms"),
    ("slot_wait_mean", "slot wait mean ms (max_concurrency; outside TTFT/E2E)"),
    ("ttft_mean", "TTFT mean ms"),
    ("server_ttft_mean", "TTFT mean ms, the server's own (/metrics)"),
    ("tpot_mean", "TPOT mean ms"),
    ("server_tpot_mean", "TPOT mean ms, the server's own (/metrics)"),
    ("e2e_mean", "E2E mean ms"),
    ("server_e2e_mean", "E2E mean ms, the server's own (/metrics)"),
    ("server_cached_pct", "prompt tokens from the prefix cache, % (the server's)"),
    ("client_cpu_pct", "client CPU % of one core"),
    ("server_cpu_pct", "server CPU % of one core"),
)


# ------------------------------------------------------------------------ figures


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), p))


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _ms(seconds: float | None) -> float | None:
    """Seconds to milliseconds; None (no values to summarize) stays None."""
    return None if seconds is None else 1000 * seconds


def autotune_figures(
    records: Sequence[RequestRecord], metrics: Any, *, first_wave: int = 0,
    offsets: Sequence[float] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """autotune's own figures (its ``Metrics``), and its records under the others' rules;
    ``first_wave``: how many requests (by dispatch index) the start-up wave has; ``offsets``
    (open loop): the arrival schedule it ran, by request index (slot waits, and whether the
    records' due times are the schedule's)."""
    ok = [r for r in records if r.ok]
    later = [t for r in ok if r.index >= first_wave and (t := r.ttft_s) is not None]
    vllm_gaps: list[float] = []  # vLLM's ITL: every chunk with choices, the finish chunk too
    last_text: list[float] = []
    for r in ok:
        times = [*r.chunk_times, r.end_time]
        vllm_gaps.extend(b - a for a, b in zip(times, times[1:], strict=False))
        if r.chunk_times:
            last_text.append(r.chunk_times[-1] - r.send_time)
    m = metrics
    return {
        "output_tok_s": m.output_throughput,
        "ttft_p50": m.ttft_ms.p50,
        "ttft_p99": m.ttft_ms.p99,
        "ttft_p99_after_first_wave": _ms(_pct(later, 99)),
        "ttft_mean": m.ttft_ms.mean,
        "tpot_mean": m.tpot_ms.mean,
        "e2e_mean": m.e2e_ms.mean,
        "tpot_p50": m.tpot_ms.p50,
        "tpot_p99": m.tpot_ms.p99,
        "itl_p50": m.itl_ms.p50,
        "itl_p99": m.itl_ms.p99,
        "itl_mean": m.itl_ms.mean,
        "e2e_p50": m.e2e_ms.p50,
        "e2e_p99": m.e2e_ms.p99,
        "duration_s": m.duration_s,
        "completed": m.completed,
        "failed": m.failed,
        "output_tokens": m.output_tokens,
        "input_tokens": m.input_tokens,
        "itl_mean_vllm": _ms(_mean(vllm_gaps)),
        "e2e_p50_last_text": _ms(_pct(last_text, 50)),
        "request_throughput": m.request_throughput,
        **_autotune_open_loop(records, m, offsets),
    }


def _autotune_open_loop(
    records: Sequence[RequestRecord], m: Any, offsets: Sequence[float] | None
) -> dict[str, Any]:
    lag = m.send_lag_ms
    out: dict[str, Any] = {
        "offered_rate": m.arrival_rate,
        "send_lag_p50": None if lag is None else lag.p50,
        "send_lag_p99": None if lag is None else lag.p99,
    }
    due = [r.due_time for r in sorted(records, key=lambda r: r.index)]
    if offsets is not None and due and all(d is not None for d in due):
        ordered = [offsets[r.index] for r in sorted(records, key=lambda r: r.index)]
        waits = slot_waits(due, ordered)  # type: ignore[arg-type]
        out["first_arrival_s"] = offsets[0]
        out["slot_wait_mean"] = 1000 * statistics.fmean(waits)
        out["due_match"] = due_match(due, ordered)  # type: ignore[arg-type]
    return out


def vllm_figures(
    result: Mapping[str, Any], *, first_wave: int = 0, offsets: Sequence[float] | None = None
) -> dict[str, Any]:
    """``vllm bench serve``'s saved result (``--save-result --save-detailed``), and its
    per-request data under autotune's rules (its lists are in dataset = dispatch order);
    ``offsets`` (open loop): its arrival schedule as :func:`vllm_arrival_offsets` rebuilds it.

    A request's arrival is ``start_time - queue_time``: the instant its task was created,
    after the schedule's sleep and before the ``max_concurrency`` semaphore (serve.py
    976-984, 1070); its send lag is that minus its scheduled offset, less the smallest such
    difference (vLLM does not save its start instant)."""
    ok = [i for i, err in enumerate(result["errors"]) if not err]
    later = [result["ttfts"][i] for i in ok if i >= first_wave]
    starts = [result["start_times"][i] for i in ok]
    ends = [result["start_times"][i] + result["latencies"][i] for i in ok]
    span = max(ends) - min(starts) if ok else 0.0
    text_gaps: list[float] = []
    for i in ok:
        gaps = list(result["itls"][i])
        n = result["output_lens"][i]
        # vLLM appends a gap for every chunk with choices, text or not: a server that ends
        # with a chunk of empty text (finish_reason only; SGLang, the sim) gets one more gap
        # than it has text chunks. With one token per text chunk that is the one past n - 1.
        if len(gaps) == n and n > 0:
            gaps = gaps[:-1]
        text_gaps.extend(gaps)
    return {
        "output_tok_s": result["output_throughput"],
        "ttft_p50": result["p50_ttft_ms"],
        "ttft_p99": result["p99_ttft_ms"],
        "ttft_p99_after_first_wave": _ms(_pct(later, 99)),
        "ttft_mean": result["mean_ttft_ms"],
        "tpot_mean": result["mean_tpot_ms"],
        "e2e_mean": result["mean_e2el_ms"],
        "tpot_p50": result["p50_tpot_ms"],
        "tpot_p99": result["p99_tpot_ms"],
        "itl_p50": result["p50_itl_ms"],
        "itl_p99": result["p99_itl_ms"],
        "itl_mean": result["mean_itl_ms"],
        "e2e_p50": result["p50_e2el_ms"],
        "e2e_p99": result["p99_e2el_ms"],
        "duration_s": result["duration"],
        "completed": result["completed"],
        "failed": result["failed"],
        "output_tokens": result["total_output_tokens"],
        "input_tokens": result["total_input_tokens"],
        "output_tok_s_first_send_last_end": result["total_output_tokens"] / span if span else None,
        "itl_p50_text_chunks": _ms(_pct(text_gaps, 50)),
        "itl_mean_text_chunks": _ms(_mean(text_gaps)),
        "request_throughput": result["request_throughput"],
        **_vllm_open_loop(result, offsets),
    }


def _vllm_open_loop(result: Mapping[str, Any], offsets: Sequence[float] | None) -> dict[str, Any]:
    queue = result.get("queue_times")
    if offsets is None or not queue:
        return {}
    arrivals = [s - q for s, q in zip(result["start_times"], queue, strict=True)]
    span = max(arrivals) - min(arrivals)
    behind = [a - o for a, o in zip(arrivals, offsets, strict=True)]
    lags = [b - min(behind) for b in behind]
    return {
        "offered_rate": (len(arrivals) - 1) / span if span > 0 else None,
        "first_arrival_s": offsets[0],
        "send_lag_p50": _ms(_pct(lags, 50)),
        "send_lag_p99": _ms(_pct(lags, 99)),
        "send_lag_max": 1000 * max(lags),
        "slot_wait_mean": 1000 * statistics.fmean(queue),
    }


def aiperf_figures(data: Mapping[str, Any]) -> dict[str, Any]:
    """AIPerf's ``profile_export_aiperf.json`` (its "inter_token_latency" is vLLM's TPOT;
    its inter-chunk latency is what the others call ITL)."""

    def stat(key: str, p: str) -> float | None:
        value = (data.get(key) or {}).get(p)
        return None if value is None else float(value)

    duration = stat("benchmark_duration", "avg")
    return {
        "output_tok_s": stat("output_token_throughput", "avg"),
        "ttft_p50": stat("time_to_first_token", "p50"),
        "ttft_p99": stat("time_to_first_token", "p99"),
        "ttft_mean": stat("time_to_first_token", "avg"),
        "tpot_mean": stat("inter_token_latency", "avg"),
        "e2e_mean": stat("request_latency", "avg"),
        "tpot_p50": stat("inter_token_latency", "p50"),
        "tpot_p99": stat("inter_token_latency", "p99"),
        "itl_p50": stat("inter_chunk_latency", "p50"),
        "itl_p99": stat("inter_chunk_latency", "p99"),
        "itl_mean": stat("inter_chunk_latency", "avg"),
        "e2e_p50": stat("request_latency", "p50"),
        "e2e_p99": stat("request_latency", "p99"),
        "duration_s": duration,
        "completed": stat("request_count", "avg"),
        "failed": stat("error_request_count", "avg") or 0,
        "output_tokens": stat("total_output_tokens", "avg") or stat("total_osl", "avg"),
        "input_tokens": stat("total_isl", "avg"),
    }


@dataclass
class Run:
    tool: str
    round: int
    seed: int
    figures: dict[str, Any]
    wall_s: float
    texts: list[str] | None = None
    input_lens: list[int] | None = None

    def public(self) -> dict[str, Any]:
        return {"tool": self.tool, "round": self.round, "seed": self.seed,
                "wall_s": self.wall_s, **self.figures}  # fmt: skip


@dataclass
class Row:
    key: str
    label: str
    means: dict[str, float | None] = field(default_factory=dict)
    spreads: dict[str, float | None] = field(default_factory=dict)
    """Relative SD of each arm's value over the rounds."""
    diffs: dict[tuple[str, str], float | None] = field(default_factory=dict)
    """Per pair ``(a, b)`` of :data:`PAIRS`: (mean of a - mean of b) / mean of b."""
    paired: dict[tuple[str, str], float | None] = field(default_factory=dict)
    """Per pair: the mean over rounds of |a - b| / b within a round."""

    def public(self) -> dict[str, Any]:
        return {
            "key": self.key, "label": self.label, "means": self.means, "spreads": self.spreads,
            "diffs": {f"{a} vs {b}": v for (a, b), v in self.diffs.items()},
            "paired": {f"{a} vs {b}": v for (a, b), v in self.paired.items()},
        }  # fmt: skip


def summarize(runs: Sequence[Run], keys: Sequence[tuple[str, str]] = FIGURES) -> list[Row]:
    """One row per figure with a value: each arm's mean and relative SD over the rounds, and
    per pair of arms the relative difference of the means and the mean per-round |difference|."""
    tools = [t for t in TOOLS if any(r.tool == t for r in runs)]
    pairs = [(a, b) for a, b in PAIRS if a in tools and b in tools]
    rows = []
    for key, label in keys:
        row = Row(key, label)
        by_round: dict[str, dict[int, float]] = {}
        for tool in tools:
            got = {
                r.round: float(v)
                for r in runs
                if r.tool == tool and (v := r.figures.get(key)) is not None
            }
            by_round[tool] = got
            values = list(got.values())
            mean = statistics.fmean(values) if values else None
            row.means[tool] = mean
            row.spreads[tool] = (
                statistics.stdev(values) / abs(mean) if len(values) > 1 and mean else None
            )
        if all(m is None for m in row.means.values()):
            continue
        for a, b in pairs:
            ma, mb = row.means.get(a), row.means.get(b)
            row.diffs[(a, b)] = (ma - mb) / mb if ma is not None and mb else None
            rel = [
                abs(by_round[a][k] - by_round[b][k]) / abs(by_round[b][k])
                for k in by_round[a].keys() & by_round[b].keys()
                if by_round[b][k]
            ]
            row.paired[(a, b)] = statistics.fmean(rel) if rel else None
        rows.append(row)
    return rows


def identity(runs: Sequence[Run]) -> list[str]:
    """Per round, whether the tools' requests were the same (texts and prompt lengths)."""
    notes = []
    for rnd in sorted({r.round for r in runs}):
        v = next((r for r in runs if r.round == rnd and r.tool == "vllm"), None)
        for arm in ("autotune", "autotune_replay"):
            a = next((r for r in runs if r.round == rnd and r.tool == arm), None)
            if a is None or v is None or a.texts is None or v.texts is None:
                continue
            same_text = sum(x == y for x, y in zip(a.texts, v.texts, strict=False))
            same_len = sum(
                x == y for x, y in zip(a.input_lens or [], v.input_lens or [], strict=False)
            )
            notes.append(
                f"round {rnd}, {LABELS[arm]} and vllm: generated text equal at {same_text}/"
                f"{len(a.texts)} request indices, prompt tokens (server usage) equal at "
                f"{same_len}/{len(a.texts)}"
            )
    return notes
