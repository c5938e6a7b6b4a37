"""SGLang's long command-line flags, bundled so a search space is checked offline.

Flags come from ``python/sglang/srt/server_args.py`` (sgl-project/sglang; the explicit
``add_argument`` era plus the newer dataclass-derived names and the flags DOMAIN.md §2 and the
lever table rely on). The list is used for two checks that each save a restart:

* an *abbreviation* (``--tp`` for ``--tp-size``): argparse accepts unique prefixes, so a
  typo can silently select another flag; we never emit one;
* an *unknown* flag: a strict error, with close matches, unless the space sets
  ``allow_unknown_flags: true`` (vLLM and other servers).
"""

from __future__ import annotations

import difflib
import re

SGLANG_FLAGS: tuple[str, ...] = (
    # Model and tokenizer
    "--model-path",
    "--model",
    "--tokenizer-path",
    "--tokenizer-mode",
    "--tokenizer-worker-num",
    "--skip-tokenizer-init",
    "--load-format",
    "--model-loader-extra-config",
    "--trust-remote-code",
    "--context-length",
    "--is-embedding",
    "--enable-multimodal",
    "--revision",
    "--model-impl",
    "--impl",
    "--dtype",
    "--kv-cache-dtype",
    "--quantization",
    "--quantization-param-path",
    "--served-model-name",
    "--chat-template",
    "--completion-template",
    "--download-dir",
    "--json-model-override-args",
    "--preferred-sampling-params",
    # HTTP server
    "--host",
    "--port",
    "--skip-server-warmup",
    "--warmups",
    "--nccl-port",
    "--api-key",
    "--file-storage-path",
    "--enable-cache-report",
    "--reasoning-parser",
    "--tool-call-parser",
    # Memory and scheduling
    "--mem-fraction-static",
    "--max-running-requests",
    "--max-queued-requests",
    "--max-total-tokens",
    "--chunked-prefill-size",
    "--max-prefill-tokens",
    "--schedule-policy",
    "--schedule-conservativeness",
    "--cpu-offload-gb",
    "--page-size",
    "--hybrid-kvcache-ratio",
    "--swa-full-tokens-ratio",
    "--disable-hybrid-swa-memory",
    # Runtime and parallelism
    "--tensor-parallel-size",
    "--tp-size",
    "--pipeline-parallel-size",
    "--pp-size",
    "--max-micro-batch-size",
    "--data-parallel-size",
    "--dp-size",
    "--load-balance-method",
    "--expert-parallel-size",
    "--ep-size",
    "--moe-dense-tp-size",
    "--stream-interval",
    "--stream-output",
    "--random-seed",
    "--constrained-json-whitespace-pattern",
    "--watchdog-timeout",
    "--dist-timeout",
    "--base-gpu-id",
    "--gpu-id-step",
    "--sleep-on-idle",
    "--dist-init-addr",
    "--nccl-init-addr",
    "--nnodes",
    "--node-rank",
    "--device",
    # Logging and metrics
    "--log-level",
    "--log-level-http",
    "--log-requests",
    "--log-requests-level",
    "--crash-dump-folder",
    "--show-time-cost",
    "--enable-metrics",
    "--bucket-time-to-first-token",
    "--bucket-inter-token-latency",
    "--bucket-e2e-request-latency",
    "--collect-tokens-histogram",
    "--kv-events-config",
    "--decode-log-interval",
    "--enable-request-time-stats-logging",
    # LoRA
    "--enable-lora",
    "--lora-paths",
    "--max-loras-per-batch",
    "--lora-backend",
    # Kernel backends
    "--attention-backend",
    "--prefill-attention-backend",
    "--decode-attention-backend",
    "--sampling-backend",
    "--grammar-backend",
    "--mm-attention-backend",
    "--moe-runner-backend",
    "--moe-a2a-backend",
    "--fp8-gemm-backend",
    "--fp4-gemm-backend",
    "--nsa-prefill-backend",
    "--nsa-decode-backend",
    # Speculative decoding
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-draft-model-revision",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-accept-threshold-single",
    "--speculative-accept-threshold-acc",
    "--speculative-token-map",
    "--speculative-attention-mode",
    "--speculative-draft-attention-backend",
    "--speculative-moe-runner-backend",
    # Expert parallelism
    "--enable-ep-moe",
    "--enable-flashinfer-moe",
    "--enable-deepep-moe",
    "--deepep-mode",
    "--deepep-config",
    "--ep-num-redundant-experts",
    "--ep-dispatch-algorithm",
    "--init-expert-location",
    "--enable-eplb",
    "--eplb-algorithm",
    "--eplb-rebalance-num-iterations",
    "--eplb-rebalance-layers-per-chunk",
    "--expert-distribution-recorder-mode",
    "--expert-distribution-recorder-buffer-size",
    "--enable-expert-distribution-metrics",
    # Hierarchical cache
    "--enable-hierarchical-cache",
    "--hicache-ratio",
    "--hicache-size",
    "--hicache-write-policy",
    "--hicache-io-backend",
    "--hicache-storage-backend",
    # Optimization and debug
    "--disable-radix-cache",
    "--cuda-graph-max-bs",
    "--cuda-graph-max-bs-decode",
    "--cuda-graph-bs",
    "--disable-cuda-graph",
    "--disable-cuda-graph-padding",
    "--enable-profile-cuda-graph",
    "--enable-nccl-nvls",
    "--enable-symm-mem",
    "--enable-tokenizer-batch-encode",
    "--disable-outlines-disk-cache",
    "--disable-custom-all-reduce",
    "--enable-mscclpp",
    "--disable-overlap-schedule",
    "--enable-mixed-chunk",
    "--enable-dp-attention",
    "--enable-dp-lm-head",
    "--enable-two-batch-overlap",
    "--enable-torch-compile",
    "--torch-compile-max-bs",
    "--torchao-config",
    "--enable-nan-detection",
    "--enable-p2p-check",
    "--triton-attention-reduce-in-fp32",
    "--triton-attention-num-kv-splits",
    "--triton-attention-split-tile-size",
    "--num-continuous-decode-steps",
    "--delete-ckpt-after-loading",
    "--enable-memory-saver",
    "--allow-auto-truncate",
    "--enable-custom-logit-processor",
    "--flashinfer-mla-disable-ragged",
    "--disable-shared-experts-fusion",
    "--disable-chunked-prefix-cache",
    "--disable-fast-image-processor",
    "--enable-return-hidden-states",
    "--enable-deterministic-inference",
    # PD disaggregation
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--disaggregation-ib-device",
    "--disaggregation-decode-tp",
    "--disaggregation-decode-dp",
    "--disaggregation-prefill-pp",
    "--num-reserved-decode-tokens",
)
"""Real long flags of ``sglang.launch_server`` (not exhaustive; extend when a space needs one)."""

FLAG_PATTERN = r"^--[A-Za-z0-9][A-Za-z0-9_.-]*$"
_FLAG_RE = re.compile(FLAG_PATTERN)
_KNOWN = frozenset(SGLANG_FLAGS)


def flag_problem(flag: str, *, allow_unknown: bool = False) -> tuple[str, list[str]] | None:
    """Why ``flag`` must not be emitted, with the flags to suggest; ``None`` when it is fine.

    ``allow_unknown`` switches the SGLang list off entirely (only the long-form shape is
    checked): a vLLM flag may well be a prefix of an unrelated SGLang flag.
    """
    if not _FLAG_RE.fullmatch(flag):
        return (
            f"'{flag}' is not a long-form flag: it must start with '--' followed by a name "
            "(no '=value', no single-dash short options)",
            [],
        )
    if allow_unknown or flag in _KNOWN:
        return None
    longer = sorted(known for known in _KNOWN if known.startswith(flag))
    if longer:
        return (
            f"'{flag}' is an abbreviation (argparse would silently expand it); write the full flag",
            longer,
        )
    close = difflib.get_close_matches(flag, SGLANG_FLAGS, n=5, cutoff=0.6)
    return (
        f"unknown SGLang flag '{flag}' (set allow_unknown_flags: true for other servers)",
        close,
    )
