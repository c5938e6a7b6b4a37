from __future__ import annotations

import sys
from pathlib import Path

# Test helper modules (e2e_helpers, conftest_results) live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))
