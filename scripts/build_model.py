"""Build a random-weight Llama with a local tokenizer: the model autotune's real-engine runs serve.

There is no model hub on these machines, so a model is made from a config: Llama architecture,
bf16, untied weights, plus a word-level tokenizer holding every word of autotune's text prompts
as one token (a 128-word prompt is 128 tokens). The end-of-sequence row of the output layer is
zero, so its logit is exactly 0 while some of the other random logits are positive: greedy
decoding never stops early and every request produces its full ``max_tokens`` even on a server
that refuses ``ignore_eos``. Built the same way everywhere, so a preset names the sizes:

* ``tiny`` (default): hidden 256, 2 layers, 4 heads, 4096 words; 3.4M parameters, 7 MB, built in
  about 2 s on a CPU: what the vLLM CPU tests and ``launchers/vllm-cpu-local.yaml`` serve.
* ``h200-2.8b``: hidden 3072, 28 layers, 24 heads / 8 KV heads, MLP 8192; 2.84B parameters, the
  model issue 7's hand measurements served on one H200 (``scripts/h200/run.sh``).
* ``h200-7b``: Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads / 8 KV heads, MLP 14336,
  8192 positions) with the 4096-word vocabulary: 7.0B parameters, 14 GB; the dense model of the
  vLLM-on-an-H200 study (``studies/vllm-h200-dense.yaml``).
* ``h200-moe``: Mixtral's architecture (``MixtralForCausalLM``) at hidden 2048, 16 layers, 16
  heads / 4 KV heads, 32 experts of MLP 1408, 4 routed per token: 4.61B parameters, 0.8B active
  per token; the MoE model of ``studies/vllm-h200-moe.yaml``, where vLLM's fused-MoE kernel
  and its configuration (E=32, N=1408) are the levers.
* ``tiny-moe``: the same architecture at the tiny preset's size (4 experts, 2 routed), for
  checking the MoE path on a CPU.

A directory that already holds the model built with the same settings is left as it is (the
settings are kept in ``autotune-model.json``); different settings rebuild it.

    python3 scripts/build_model.py --out /tmp/autotune-model-tiny
    python3 scripts/build_model.py --preset h200-2.8b --out /tmp/autotune-model
    python3 scripts/build_model.py --preset h200-moe --out /tmp/autotune-moe
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
STAMP = "autotune-model.json"
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {
        "vocab": 4096,
        "hidden": 256,
        "intermediate": 512,
        "layers": 2,
        "heads": 4,
        "kv_heads": 4,
        "max_len": 2048,
    },
    "h200-2.8b": {
        "vocab": 4096,
        "hidden": 3072,
        "intermediate": 8192,
        "layers": 28,
        "heads": 24,
        "kv_heads": 8,
        "max_len": 4096,
    },
    "h200-7b": {
        "vocab": 4096,
        "hidden": 4096,
        "intermediate": 14336,
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "max_len": 8192,
    },
    # experts > 0: a Mixtral-shaped mixture of experts (intermediate is one expert's MLP)
    "h200-moe": {
        "vocab": 4096,
        "hidden": 2048,
        "intermediate": 1408,
        "layers": 16,
        "heads": 16,
        "kv_heads": 4,
        "max_len": 4096,
        "experts": 32,
        "top_k": 4,
    },
    "tiny-moe": {
        "vocab": 4096,
        "hidden": 256,
        "intermediate": 256,
        "layers": 2,
        "heads": 4,
        "kv_heads": 4,
        "max_len": 2048,
        "experts": 4,
        "top_k": 2,
    },
}
SIZE_FIELDS = (
    "vocab",
    "hidden",
    "intermediate",
    "layers",
    "heads",
    "kv_heads",
    "max_len",
    "experts",
    "top_k",
)


def vocabulary(size: int) -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from autotune.loadgen.datasets import PROMPT_WORDS

    words = list(dict.fromkeys([*SPECIALS, *PROMPT_WORDS]))
    words += [f"w{i:04d}" for i in range(size - len(words))]
    return words[:size]


def build_tokenizer(words: list[str], out: Path, *, max_len: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # no decoder: decode joins with " "
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=max_len,
    )
    fast.save_pretrained(out)


def build_model(vocab: int, out: Path, args: argparse.Namespace) -> int:
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
    )

    common = dict(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_len,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        dtype="bfloat16",
    )
    config: LlamaConfig | MixtralConfig
    if args.experts:
        # transformers 5.x saves the experts as fused tensors, which vLLM 0.26.0 loads.
        config = MixtralConfig(
            num_local_experts=args.experts, num_experts_per_tok=args.top_k, **common
        )
        arch: type = MixtralForCausalLM
    else:
        config = LlamaConfig(**common)
        arch = LlamaForCausalLM
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = arch(config)
    with torch.no_grad():
        model.lm_head.weight[config.eos_token_id].zero_()
    model.generation_config = GenerationConfig(
        bos_token_id=1, eos_token_id=2, pad_token_id=3, do_sample=False
    )
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for name in SIZE_FIELDS:
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, help="overrides the preset")
    args = ap.parse_args(argv)
    preset = {"experts": 0, "top_k": 0, **PRESETS[args.preset]}
    sizes = {k: getattr(args, k) or v for k, v in preset.items()}
    if sizes["experts"] and not 0 < sizes["top_k"] <= sizes["experts"]:
        ap.error(f"--top-k must be 1..{sizes['experts']} (the number of experts)")
    for k, v in sizes.items():
        setattr(args, k, v)
    # A dense model's stamp names no experts (the stamps of models built before MoE still match).
    recorded = {k: v for k, v in sizes.items() if v or k not in ("experts", "top_k")}
    stamp = args.out / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == recorded:
        print(f"model already at {args.out} ({args.preset})")
        return
    t0 = time.monotonic()
    if args.out.exists():
        shutil.rmtree(args.out)  # other settings, or an interrupted build
    tmp = args.out.with_name(args.out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    words = vocabulary(args.vocab)
    build_tokenizer(words, tmp, max_len=args.max_len)
    n = build_model(len(words), tmp, args)
    (tmp / STAMP).write_text(json.dumps(recorded, indent=2) + "\n")
    tmp.rename(args.out)  # complete or absent: an interrupted build is never served
    kind = f"Mixtral ({args.experts} experts)" if args.experts else "Llama"
    print(f"built {n / 1e6:.1f}M-parameter {kind} in {args.out} in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
