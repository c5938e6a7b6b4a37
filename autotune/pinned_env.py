"""Variables fixed in every service's environment: NVLink multicast off.

NVLink multicast (NCCL's NVLS and NVLSTree algorithms, PyTorch's symmetric-memory multicast,
NVSHMEM's NVLS collectives) can, when a program gets it wrong, put every GPU of a host out of
service for a day or more; on a multi-GPU host shared with others that takes their GPUs down
too. A tuner that starts hundreds of engines with NCCL and all-reduce levers in play must never
be the program that does it. So every service autotune renders gets these values, whatever its
deployment says and whatever the shell it starts from holds, and nothing may change them:
``space check`` refuses a lever that sets or unsets one, and a deployment file that sets
another value is refused when it is loaded.

What it costs: on NVSwitch machines NCCL's NVLS all-reduce is one of the algorithms NCCL may
pick for large messages; trials (and the exported winner, which carries these lines as it was
measured) run with Ring/Tree and vLLM's custom all-reduce instead.
"""

from __future__ import annotations

from types import MappingProxyType

PINNED_ENV = MappingProxyType(
    {
        # NCCL env.rst: NCCL_NVLS_ENABLE, NVLink SHARP (multicast) collectives; 0 disables.
        "NCCL_NVLS_ENABLE": "0",
        # PyTorch torch/csrc/distributed/c10d/symm_mem: no multicast objects for symmetric
        # memory (vLLM's symmetric-memory all-reduce then works without multimem).
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        # NVSHMEM's environment: no NVLS (multicast) collectives.
        "NVSHMEM_DISABLE_NVLS": "1",
    }
)
"""Name -> the only value a service's environment may hold."""


def pinned_problem(name: str, value: str | None) -> str | None:
    """Why setting ``name`` to ``value`` (``None``: unsetting it) is refused, or ``None``."""
    fixed = PINNED_ENV.get(name)
    if fixed is None or value == fixed:
        return None
    what = "unset" if value is None else f"set to {value!r}"
    return (
        f"{name} is fixed to {fixed!r} in every service's environment (NVLink multicast off: "
        f"it can take a host's GPUs out of service, autotune/pinned_env.py); it cannot be {what}"
    )
