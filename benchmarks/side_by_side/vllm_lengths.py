"""Our random dataset's lengths as ``vllm bench serve --dataset-name random`` options.

Ours (``autotune/loadgen/_draw.py``, ``_draw_len``, sglang's rule): each length uniform over
the integers ``[max(int(len * range_ratio), 1), len]``; 1.0 fixes it.

vLLM's (``vllm/benchmarks/datasets/utils.py``, ``get_sampling_params``, the same in 0.26.0 and
0.32.0): a ``--random-range-ratio r`` (one float for input and output, or a JSON dict
``{"input": ri, "output": ro}``) and ``--random-input-len L`` draw the prompt's content
uniformly over ``[floor(real * (1 - r)), ceil(real * (1 + r))]`` with ``real = L -
tokenizer.num_special_tokens_to_add()``, and the output over ``[max(floor(O * (1 - r)), 1),
max(ceil(O * (1 + r)), 1)]``; r must be in [0, 1).

So our ``[lo, hi]`` becomes the centre ``(lo + hi) / 2`` and ``r = (hi - lo) / (hi + lo)``:
ours input_len 2048, ratio 0.125 ([256, 2048]) is vLLM's ``--random-input-len 1152
--random-range-ratio 0.7777`` (r rounded down: 0.7778 would draw over 255-2049).
Both tools then send the same distribution of prompt tokens (the server adds the same special
tokens to either) and ask for the same distribution of output tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def our_interval(length: int, ratio: float) -> tuple[int, int]:
    """The lengths our random dataset draws from (``_draw_len``)."""
    return max(int(length * ratio), 1), length


def vllm_input_interval(input_len: int, ratio: float, special: int = 0) -> tuple[int, int]:
    """The prompt-content lengths vLLM's random dataset draws from (``get_sampling_params``)."""
    real = max(0, int(input_len) - special)
    return math.floor(real * (1 - ratio)), math.ceil(real * (1 + ratio))


def vllm_output_interval(output_len: int, ratio: float) -> tuple[int, int]:
    """The output lengths vLLM's random dataset asks for (``get_sampling_params``)."""
    low = max(math.floor(output_len * (1 - ratio)), 1)
    return low, max(math.ceil(output_len * (1 + ratio)), 1)


@dataclass(frozen=True)
class VllmLength:
    """One side (input or output) as vLLM options, and what vLLM then draws."""

    length: int
    """``--random-input-len`` / ``--random-output-len``."""
    ratio: str
    """The range ratio as passed (a decimal vLLM reads back with ``float()``)."""
    ours: tuple[int, int]
    vllm: tuple[int, int]

    @property
    def exact(self) -> bool:
        return self.ours == self.vllm


def _candidates(lo: int, hi: int, centre: int) -> list[str]:
    """Ratios around the one that maps ``centre`` onto ``[lo, hi]``, shortest first; each
    rounded down and up at 4 to 12 decimals (down is what lands an exact centre on the bounds)."""
    exact = max(centre - lo, hi - centre) / centre
    out = []
    for digits in range(4, 13):
        scale = 10**digits
        for value in (math.floor(exact * scale), math.ceil(exact * scale)):
            r = value / scale
            if 0 <= r < 1:
                out.append(f"{r:.{digits}f}".rstrip("0").rstrip(".") or "0")
    return out


def to_vllm(length: int, ratio: float, *, special: int = 0, output: bool = False) -> VllmLength:
    """Our ``(length, range_ratio)`` as vLLM's ``(len, range ratio)`` drawing over the same
    integers, or the nearest vLLM can (a range whose ends sum to an odd number has no integer
    centre: then one end is one token off, which :attr:`VllmLength.exact` tells).

    ``special``: the tokenizer's ``num_special_tokens_to_add()`` (input only), which vLLM takes
    off ``--random-input-len`` before drawing."""
    lo, hi = our_interval(length, ratio)
    extra = 0 if output else special

    def interval(centre: int, r: str) -> tuple[int, int]:
        if output:
            return vllm_output_interval(centre, float(r))
        return vllm_input_interval(centre + extra, float(r), extra)

    if lo == hi:
        return VllmLength(lo + extra, "0", (lo, hi), interval(lo, "0"))
    best: tuple[tuple[int, int], VllmLength] | None = None
    for centre in sorted({(lo + hi) // 2, (lo + hi + 1) // 2}):
        for r in _candidates(lo, hi, centre):
            got = interval(centre, r)
            score = (abs(got[0] - lo) + abs(got[1] - hi), len(r))
            if best is None or score < best[0]:
                best = (score, VllmLength(centre + extra, r, (lo, hi), got))
    assert best is not None
    return best[1]


@dataclass(frozen=True)
class VllmLoad:
    """The ``--random-*`` options of ``vllm bench serve`` for one random dataset."""

    input: VllmLength
    output: VllmLength
    special: int

    @property
    def range_ratio(self) -> str | None:
        """``--random-range-ratio``'s value: one float when both sides share it, else vLLM's
        JSON dict; ``None`` for fixed lengths (vLLM's default, 0)."""
        if self.input.ratio == self.output.ratio:
            return None if self.input.ratio == "0" else self.input.ratio
        return json.dumps({"input": float(self.input.ratio), "output": float(self.output.ratio)})

    def argv(self) -> list[str]:
        out = [
            "--random-input-len",
            str(self.input.length),
            "--random-output-len",
            str(self.output.length),
        ]
        if self.range_ratio is not None:
            out += ["--random-range-ratio", self.range_ratio]
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "argv": self.argv(),
            "special_tokens": self.special,
            "input": {"ours": self.input.ours, "vllm": self.input.vllm},
            "output": {"ours": self.output.ours, "vllm": self.output.vllm},
            "exact": self.input.exact and self.output.exact,
        }


def vllm_load(input_len: int, output_len: int, ratio: float, *, special: int = 0) -> VllmLoad:
    return VllmLoad(
        to_vllm(input_len, ratio, special=special),
        to_vllm(output_len, ratio, output=True),
        special,
    )


def special_tokens_added(model_dir: str | Path) -> int:
    """``tokenizer.num_special_tokens_to_add()`` of a Hugging Face tokenizer directory, read
    from its files (no transformers here): tokenizer.json's post-processor, else
    tokenizer_config.json's ``add_bos_token``/``add_eos_token``; 0 when neither says (the
    models of scripts/build_model.py add none)."""
    d = Path(model_dir)
    try:
        post = json.loads((d / "tokenizer.json").read_text()).get("post_processor")
        return _post_processor_specials(post)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(bool(cfg.get("add_bos_token"))) + int(bool(cfg.get("add_eos_token")))


def _post_processor_specials(post: Any) -> int:
    if not isinstance(post, dict):
        return 0
    kind = post.get("type")
    if kind == "TemplateProcessing":
        return sum(1 for piece in post.get("single", []) if "SpecialToken" in piece)
    if kind in ("BertProcessing", "RobertaProcessing"):
        return 2
    if kind == "Sequence":
        return sum(_post_processor_specials(p) for p in post.get("processors", []))
    return 0
