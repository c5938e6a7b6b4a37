"""The load both tools run: autotune's spec, the arrival schedules, the prompts and datasets."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.loadgen import LoadSpec
from autotune.loadgen.client import _Bodies

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


def first_wave(load: Load) -> int:
    return load.concurrency if load.closed else 0
