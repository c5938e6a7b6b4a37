"""Any other server: only the shape of each flag is checked (no manifest, no quirks)."""

from __future__ import annotations

from typing import ClassVar

from autotune.engines._base import BaseEngine


class GenericEngine(BaseEngine):
    """Unchecked: a space for a server autotune has no manifest of. Flags must still be
    long-form (``--name``); nothing else about them is known."""

    name: ClassVar[str] = "generic"
    default_version: ClassVar[str | None] = None

    def __init__(self, *, version: str | None = None) -> None:
        super().__init__(version=None)
        self.declared_version = version
