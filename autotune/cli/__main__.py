"""``python -m autotune.cli``, the same as ``autotune``."""

from __future__ import annotations

from autotune.cli import main

main()
