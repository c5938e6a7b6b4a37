"""Fixtures of the ``autotune init`` tests (helpers: ``init_helpers``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from init_helpers import Init


@pytest.fixture
def init(tmp_path: Path) -> Init:
    return Init(tmp_path / "out")
