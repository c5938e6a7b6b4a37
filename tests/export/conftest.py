"""Makes the shared study factory (tests/conftest_results.py) importable from tests/export/.

pytest's default import mode puts only this directory on sys.path for these test modules.
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
