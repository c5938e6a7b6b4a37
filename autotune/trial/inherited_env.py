"""What a local service inherits from autotune's own environment that its engine reads.

The local manager starts a service with autotune's environment, then applies the spec's
``env`` and ``unset_env`` (:mod:`autotune.remote.managers.local`). So a variable set in the
shell that ran ``autotune run`` (``VLLM_WORKER_MULTIPROC_METHOD=fork``, ``NCCL_P2P_DISABLE=1``)
changes every trial's measurement without being one of the trial's settings. On the H100,
forking vLLM's workers instead of spawning them moved one configuration by 16%
(BENCHMARKS.md). Each trial therefore records these variables per service
(``ServiceRecord.inherited_env``), and three things use the record:

- exports set them, because systemd, compose and Kubernetes start a service with a clean
  environment; without them the unit would run something other than what was measured;
- a later session whose environment differs does not reuse an earlier trial's measurement
  for an identical configuration;
- that session says which variables changed, as ``VLLM_WORKER_MULTIPROC_METHOD: fork then,
  unset now``.

Which variables count: the ones the service's engine declares (its manifest's variable
registry, generated from the engine's own code), the ones with the engine's prefixes, and
the ones read by the libraries under every engine (:data:`LIBRARY_PREFIXES`: NCCL, CUDA,
PyTorch, ...). Secret-looking names and autotune's own ``AUTOTUNE_*`` are never recorded. A
service on another host inherits that host's environment, which autotune does not see, so
nothing is recorded for it (``None``, as for trials stored before this existed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from autotune.engines import BaseEngine
from autotune.secrets import looks_secret
from autotune.specs import ServiceSpec

LIBRARY_PREFIXES: tuple[str, ...] = (
    "NCCL_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "NVIDIA_",
    "NVSHMEM_",
    "UCX_",
    "PYTORCH_",
    "TORCH_",
    "TRITON_",
    "FLASHINFER_",
    "OMP_",
    "KMP_",
    "MKL_",
    "MALLOC_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
)
"""Variables of the libraries under every engine (NCCL, the CUDA runtime and its libraries,
PyTorch and its compilers, OpenMP, glibc's malloc, the Hugging Face loaders)."""

LIBRARY_NAMES: frozenset[str] = frozenset({"LD_PRELOAD"})
"""Single variables that change a server's speed (a preloaded allocator: vLLM on CPU
recommends tcmalloc)."""

OWN_PREFIX = "AUTOTUNE_"


def inherited_env(
    spec: ServiceSpec,
    engine: BaseEngine | None,
    *,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str] | None:
    """The variables ``spec`` inherits from ``environ`` (default: autotune's environment)
    that its engine or the libraries under it read, sorted by name; ``None`` for a
    service on another host."""
    if spec.manager != "local" or spec.on is not None:
        return None
    env = os.environ if environ is None else environ
    manifest = engine.manifest if engine is not None else None
    declared = (manifest.env_names if manifest is not None else None) or frozenset()
    prefixes = LIBRARY_PREFIXES + (engine.env_prefixes if engine is not None else ())
    own = set(spec.env) | set(spec.unset_env)
    found = {
        name: value
        for name, value in env.items()
        if name not in own
        and not name.startswith(OWN_PREFIX)
        and not looks_secret(name)
        and (name in declared or name.startswith(prefixes) or name in LIBRARY_NAMES)
    }
    return dict(sorted(found.items()))


LONG_VALUE = 60
"""A value longer than this is shown in part (:func:`env_changes`): ``NVIDIA_REQUIRE_CUDA``
of a CUDA image holds about 2,000 characters, which would bury the line that says what
changed."""

_SHOWN = 40
_BEFORE_DIFF = 12


def _shown(value: str | None, differs_at: int) -> str:
    """``value`` for a human line: whole when short, else the :data:`_SHOWN` characters
    around ``differs_at`` (where the two values part), elided ends marked and its length
    said, so two long values that differ in the middle still show how."""
    if value is None:
        return "unset"
    if len(value) <= LONG_VALUE:
        return value
    start = max(0, min(differs_at - _BEFORE_DIFF, len(value) - _SHOWN))
    end = start + _SHOWN
    head = "..." if start else ""
    tail = "..." if end < len(value) else ""
    return f"{head}{value[start:end]}{tail} ({len(value):,} chars)"


def env_changes(then: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """How the inherited variables differ, one line each: ``NAME: fork then, unset now``
    (a long value in part, around where the two differ: :func:`_shown`)."""
    out: list[str] = []
    for name in sorted(set(then) | set(now)):
        before, after = then.get(name), now.get(name)
        if before != after:
            # Where the two part (os.path.commonprefix compares any strings, not only paths).
            at = len(os.path.commonprefix([before, after])) if before and after else 0
            out.append(f"{name}: {_shown(before, at)} then, {_shown(after, at)} now")
    return out


def services_changes(
    then: Mapping[str, Mapping[str, str] | None], now: Mapping[str, Mapping[str, str] | None]
) -> list[str]:
    """:func:`env_changes` over the services both recorded (``None``: not known, skipped),
    each line prefixed with the service's name."""
    out: list[str] = []
    for name in sorted(set(then) & set(now)):
        before, after = then[name], now[name]
        if before is None or after is None:
            continue
        out += [f"{name}: {line}" for line in env_changes(before, after)]
    return out
