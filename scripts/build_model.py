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

A directory that already holds the model built with the same settings is left as it is (the
settings are kept in ``autotune-model.json``); different settings rebuild it.

    python3 scripts/build_model.py --out /tmp/autotune-model-tiny
    python3 scripts/build_model.py --preset h200-2.8b --out /tmp/autotune-model
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
    "tiny": {"vocab": 4096, "hidden": 256, "intermediate": 512, "layers": 2, "heads": 4,
             "kv_heads": 4, "max_len": 2048},
    "h200-2.8b": {"vocab": 4096, "hidden": 3072, "intermediate": 8192, "layers": 28,
                  "heads": 24, "kv_heads": 8, "max_len": 4096},
}


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
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
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
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config)
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
    for name in PRESETS["tiny"]:
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, help="overrides the preset")
    args = ap.parse_args(argv)
    sizes = {k: getattr(args, k) or v for k, v in PRESETS[args.preset].items()}
    for k, v in sizes.items():
        setattr(args, k, v)
    stamp = args.out / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == sizes:
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
    (tmp / STAMP).write_text(json.dumps(sizes, indent=2) + "\n")
    tmp.rename(args.out)  # complete or absent: an interrupted build is never served
    print(f"built {n / 1e6:.1f}M-parameter Llama in {args.out} in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
