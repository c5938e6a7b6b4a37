"""What a trial configuration sets on one service: the bridge from space to rendering."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServiceSettings:
    """Settings for one service, produced by ``SearchSpace.settings_for``.

    ``flags`` maps a long flag (``--moe-runner-backend``) to its value, or to ``None`` for a
    switch that is present without a value (``--disable-custom-all-reduce``), or to a tuple for
    a flag that takes several value tokens (``--cuda-graph-bs-decode 1 2 4 8``). A flag in
    ``remove_flags`` is removed from the deployment's base command (a switch turned off).
    ``env`` adds or overrides variables; ``unset_env`` removes them (``NCCL_PROTO`` unset).
    """

    flags: dict[str, str | tuple[str, ...] | None] = field(default_factory=dict)
    remove_flags: set[str] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)
    unset_env: set[str] = field(default_factory=set)
