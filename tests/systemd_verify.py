"""`systemd-analyze verify` for the tests that check generated units and drop-ins."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    """Verify a unit (with its ``.d/`` drop-ins beside it); without --recursive-errors=no the
    exit code is 0 even with warnings (DOMAIN.md §5)."""
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--recursive-errors=no", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )
