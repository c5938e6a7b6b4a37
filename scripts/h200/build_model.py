"""Build the random-weight Llama that issue 7's hand measurements served, on the GPU machine.

The machine has no model hub, so the model is made from a config: Llama architecture, 2.84B
parameters (hidden 3072, 28 layers, 24 heads / 8 KV heads, MLP 8192, untied 4096-word
vocabulary), bf16, plus a word-level tokenizer holding every word of autotune's text prompts
as one token (a 128-word prompt is 128 tokens). The end-of-sequence row of the output layer is
zero, so its logit is exactly 0 while some of the other 4095 random logits are positive:
greedy decoding never stops early and every request produces its full ``max_tokens`` (the
server refuses ``ignore_eos``).

    python3 scripts/h200/build_model.py --out /tmp/autotune-model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")


def vocabulary(size: int) -> list[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from autotune.loadgen.client import PROMPT_WORDS

    words = list(dict.fromkeys([*SPECIALS, *PROMPT_WORDS]))
    words += [f"w{i:04d}" for i in range(size - len(words))]
    return words[:size]


def build_tokenizer(words: list[str], out: Path) -> None:
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
        model_max_length=4096,
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
        max_position_embeddings=4096,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/autotune-model"))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=8)
    args = ap.parse_args()
    if (args.out / "model.safetensors.index.json").exists() or (
        args.out / "model.safetensors"
    ).exists():
        print(f"model already at {args.out}")
        return
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    words = vocabulary(args.vocab)
    build_tokenizer(words, args.out)
    n = build_model(len(words), args.out, args)
    print(f"built {n / 1e9:.3f}B-parameter Llama in {args.out} in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
