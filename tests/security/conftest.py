"""Puts the remote tests' sshd lab (``tests/remote/sshd_hosts.py``) on ``sys.path``: the
planted-secret study runs one service over real SSH with a planted private key."""

from __future__ import annotations

import sys
from pathlib import Path

_REMOTE = str(Path(__file__).resolve().parent.parent / "remote")
if _REMOTE not in sys.path:
    sys.path.insert(0, _REMOTE)
