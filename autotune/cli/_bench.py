"""``autotune bench``: the load generator alone against a server, no study involved.

The load generator and pydantic are imported inside the command (~110 ms), which
``autotune --help`` must not pay.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer
from rich.text import Text

from autotune.cli._common import check_out, check_url, console, err_console, friendly, writing
from autotune.errors import ConfigError

MAX_TOKENS = 1 << 20
"""Longest prompt or output ``bench`` builds (prompts are made in memory)."""
_BENCH_OPTIONS = {
    "concurrency": "--concurrency",
    "input_len": "--input-len",
    "output_len": "--output-len",
    "requests": "--requests",
    "duration_s": "--duration",
    "warmup_requests": "--warmup",
    "api": "--api",
    "model": "--model",
    "prompt": "--prompt",
    "request_rate": "--request-rate",
    "burstiness": "--burstiness",
    "max_concurrency": "--max-concurrency",
    "tokenizer": "--tokenizer",
    "seed": "--seed",
    "dataset.range_ratio": "--range-ratio",
    "dataset.path": "--dataset-path",
    "dataset.turns": "--turns",
    "dataset.groups": "--gsp-groups",
    "dataset.prompts_per_group": "--gsp-prompts-per-group",
    "dataset.system_prompt_len": "--gsp-system-prompt-len",
    "dataset.question_len": "--gsp-question-len",
}
DATASETS = ("random", "sharegpt", "shared_prefix")
"""LoadSpec field -> the option that sets it, so a refused value names the option."""


@friendly
def bench(
    url: str = typer.Option(..., "--url", help="Base URL of an OpenAI-compatible server."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, max=65536),
    input_len: int = typer.Option(256, "--input-len", min=1, max=MAX_TOKENS),
    output_len: int = typer.Option(32, "--output-len", min=1, max=MAX_TOKENS),
    requests: int | None = typer.Option(
        None, "--requests", min=1, help="Measured requests (default 4 x C)."
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Measure for this many seconds instead."
    ),
    warmup: int | None = typer.Option(
        None, "--warmup", min=0, help="Warm-up requests (default C)."
    ),
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    model: str | None = typer.Option(None, "--model"),
    prompt: str | None = typer.Option(
        None,
        "--prompt",
        help="token_ids or text (default: token_ids for completions, text for chat).",
    ),
    ignore_eos: bool = typer.Option(
        True,
        "--ignore-eos/--no-ignore-eos",
        help="Send ignore_eos (SGLang, vLLM); --no-ignore-eos leaves the field out for "
        "servers that refuse unknown fields (transformers serve: HTTP 422).",
    ),
    require_done: bool = typer.Option(
        True,
        "--require-done/--no-require-done",
        help="A stream must end with 'data: [DONE]'; --no-require-done also accepts a "
        "clean end after a chunk with a finish_reason (transformers serve).",
    ),
    request_rate: float | None = typer.Option(
        None,
        "--request-rate",
        help="Open loop: mean requests/s (Poisson or gamma arrivals) instead of a closed "
        "loop of --concurrency streams.",
    ),
    burstiness: float | None = typer.Option(
        None, "--burstiness", help="Gamma shape of the gaps: 1 Poisson, < 1 burstier."
    ),
    max_concurrency: int | None = typer.Option(
        None, "--max-concurrency", min=1, help="Open loop: requests in flight at most."
    ),
    dataset: str = typer.Option(
        "random", "--dataset", help="random, sharegpt (--dataset-path) or shared_prefix."
    ),
    range_ratio: float | None = typer.Option(
        None, "--range-ratio", help="random: lengths uniform from len x ratio up to len."
    ),
    dataset_path: Path | None = typer.Option(
        None, "--dataset-path", help="sharegpt: a ShareGPT-format JSON file."
    ),
    turns: str | None = typer.Option(None, "--turns", help="sharegpt: first or multi."),
    gsp_groups: int | None = typer.Option(None, "--gsp-groups", min=1),
    gsp_prompts_per_group: int | None = typer.Option(None, "--gsp-prompts-per-group", min=1),
    gsp_system_prompt_len: int | None = typer.Option(None, "--gsp-system-prompt-len", min=1),
    gsp_question_len: int | None = typer.Option(None, "--gsp-question-len", min=1),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Local tokenizer (dir or tokenizer.json) for lengths."
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds the prompts and the arrivals."),
    records: Path | None = typer.Option(
        None, "--records", help="Write raw per-request records (JSON lines)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print metrics as JSON."),
) -> None:
    """Run the load generator alone against a server."""
    from pydantic import ValidationError

    from autotune.loadgen import LoadSpec, run_load
    from autotune.loadgen.display import metrics_table
    from autotune.yamlio import validation_error_to_config_error

    check_url(url)
    if api not in ("completions", "chat"):
        raise ConfigError(f"unknown api {api!r}", field="--api", allowed=("completions", "chat"))
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise ConfigError(
            f"must be a positive number of seconds, got {duration}", field="--duration"
        )
    if records is not None:
        check_out(records, option="--records", directory=False)
    data = _dataset(
        dataset,
        input_len=input_len,
        output_len=output_len,
        options={
            "range_ratio": range_ratio,
            "path": dataset_path,
            "turns": turns,
            "output_len": None,
            "groups": gsp_groups,
            "prompts_per_group": gsp_prompts_per_group,
            "system_prompt_len": gsp_system_prompt_len,
            "question_len": gsp_question_len,
        },
    )
    open_loop = {
        k: v
        for k, v in (("burstiness", burstiness), ("max_concurrency", max_concurrency))
        if v is not None
    }
    if open_loop and request_rate is None:
        first = "--burstiness" if burstiness is not None else "--max-concurrency"
        raise ConfigError("shapes an open loop: give --request-rate too", field=first)
    try:
        spec = LoadSpec.model_validate(
            {
                "concurrency": concurrency,
                "dataset": data,
                "request_rate": request_rate,
                "tokenizer": tokenizer,
                "seed": seed,
                **open_loop,
                "warmup_requests": concurrency if warmup is None else warmup,
                "requests": None if duration is not None else (requests or 4 * concurrency),
                "duration_s": duration,
                # The measure phase's hard cap: in-flight requests get a request timeout.
                "max_duration_s": max(120.0, duration + 60.0) if duration is not None else 120.0,
                "api": api,
                "prompt": prompt,
                "ignore_eos": True if ignore_eos else None,
                "require_done": require_done,
                "model": model,
            }
        )
    except ValidationError as exc:
        err = validation_error_to_config_error(exc, file=None, model=LoadSpec)
        option = _BENCH_OPTIONS.get(err.field or "", err.field)
        raise ConfigError(err.message, field=option, allowed=err.allowed) from None
    if spec.request_rate is not None and requests is None and duration is None:
        spec = spec.model_copy(update={"requests": max(4 * concurrency, 64)})
    result = run_load(url, spec, on_phase=lambda p: err_console.print(Text(p, style="dim")))
    if records is not None:
        with writing("--records"), records.open("w") as fh:
            for r in result.records:
                fh.write(
                    json.dumps(
                        r.model_dump(mode="json") if hasattr(r, "model_dump") else r.__dict__
                    )
                    + "\n"
                )
    if as_json:
        sys.stdout.write(json.dumps(result.metrics.model_dump(mode="json"), indent=2) + "\n")
    else:
        console.print(metrics_table(result.metrics))


_DATASET_OPTIONS = {
    "random": ("range_ratio",),
    "sharegpt": ("path", "turns"),
    "shared_prefix": ("groups", "prompts_per_group", "system_prompt_len", "question_len"),
}


def _dataset(
    kind: str, *, input_len: int, output_len: int, options: dict[str, object]
) -> dict[str, object]:
    """The ``dataset:`` of the options: each kind takes its own; another kind's is an error."""
    if kind not in DATASETS:
        raise ConfigError(f"unknown dataset {kind!r}", field="--dataset", allowed=DATASETS)
    mine = _DATASET_OPTIONS[kind]
    for name, value in options.items():
        if value is not None and name not in mine:
            option = _BENCH_OPTIONS.get(f"dataset.{name}", name)
            owner = next(k for k, names in _DATASET_OPTIONS.items() if name in names)
            raise ConfigError(f"applies to --dataset {owner}, not {kind}", field=option)
    out: dict[str, object] = {"kind": kind}
    out.update({k: v for k, v in options.items() if v is not None and k in mine})
    if kind == "random":
        out.update(input_len=input_len, output_len=output_len)
    elif kind == "shared_prefix":
        out["output_len"] = output_len
    elif kind == "sharegpt" and "path" not in out:
        raise ConfigError("--dataset sharegpt needs --dataset-path FILE", field="--dataset-path")
    return out
