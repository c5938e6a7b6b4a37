"""The markdown tables BENCHMARKS.md takes from a side-by-side run's results."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .setup import STUDY_FILE, rel


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _settings(changes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "vLLM's defaults"


def print_tables(results: Mapping[str, Any]) -> None:
    print("\n| arm | best output tok/s | settings (vs vLLM's defaults) | restarts | wall |")
    print("|---|---|---|---|---|")
    a = results.get("autotune")
    if a:
        b = a.get("best") or {}
        hw = f" +- {b['half_width']:.1f}" if b.get("half_width") else ""
        tok = f"{b['tok_s']:.1f}{hw} (mean of {b['n']})" if b else "no feasible trial"
        spent = (
            f"{a['restarts']} ({a['launched_trials']} trials + {len(a['remeasurements'])} "
            f"re-measurements; {a['reused_duplicates']} duplicates reused)"
        )
        study = rel(Path(a.get("study_file", STUDY_FILE)))
        print(
            f"| autotune ({a['sampler'] or 'tpe'}, {study}) | {tok} | "
            f"{_settings(b.get('changed', {}))} | {spent} | {fmt_s(a['wall_s'])} |"
        )
    s = results.get("sweep")
    if s:
        b = s.get("best") or {}
        tok = f"{b['tok_s']:.1f} (mean of {len(b['runs'])})" if b else "no result"
        shape = f"{len(s['grid'])} combinations x {s['num_runs']} runs"
        gave_up = s.get("failed", s["failures"])
        failed = f", {len(gave_up)} failed" if gave_up else ""
        if s.get("pending"):
            failed += f", {len(s['pending'])} combinations still to run"
        print(
            f"| vllm bench sweep serve ({shape}) | {tok} | "
            f"{_settings(b.get('changed', {}))} | {s['restarts']}{failed} | "
            f"{fmt_s(s['wall_s'])} |"
        )
    d = results.get("defaults")
    if d:
        b = d["best"]
        print(
            f"| vLLM defaults (baseline command) | {b['tok_s']:.1f} (mean of "
            f"{len(d['autotune_runs'])}; vllm bench serve {b['vllm_bench_tok_s']:.1f}) | "
            f"vLLM's defaults | 1 | {fmt_s(d['wall_s'])} |"
        )
    g = results.get("agreement")
    if g:
        print(
            f"\nautotune's winner (trial {g['winner_trial']}: {_settings(g['changed'])}), "
            "one server, both load generators alternating:\n"
        )
        print("| round | tool | output tok/s | completed | output tokens | duration s |")
        print("|---|---|---|---|---|---|")
        for r in g["runs"]:
            print(
                f"| {r['round']} | {r['tool']} | {r['output_throughput']:.1f} | "
                f"{r['completed']} | {r['output_tokens']} | {r['duration_s']:.2f} |"
            )
        sd_a = f" (SD {g['autotune_sd']:.1f})" if g["autotune_sd"] is not None else ""
        sd_v = f" (SD {g['vllm_sd']:.1f})" if g["vllm_sd"] is not None else ""
        verdict = "within" if g["within_2pct"] else "NOT within"
        print(
            f"\nmeans: autotune loadgen {g['autotune_mean']:.1f}{sd_a}, vllm bench serve "
            f"{g['vllm_mean']:.1f}{sd_v} tok/s: vllm bench serve {100 * g['rel_diff']:+.2f}% "
            f"({verdict} 2%)"
        )
        ma, mv = g["means"]["autotune loadgen"], g["means"]["vllm bench serve"]
        print(
            f"per run, autotune vs vllm: {ma['output_tokens']:.0f} vs {mv['output_tokens']:.0f} "
            f"output tokens, {ma['input_tokens']:.0f} vs {mv['input_tokens']:.0f} input tokens, "
            f"{ma['duration_s']:.2f} vs {mv['duration_s']:.2f} s, TTFT p50 "
            f"{ma['ttft_p50_ms']:.0f} vs {mv['ttft_p50_ms']:.0f} ms, TPOT p50 "
            f"{ma['tpot_p50_ms']:.1f} vs {mv['tpot_p50_ms']:.1f} ms"
        )
