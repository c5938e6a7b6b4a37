"""Measured outcomes not yet in the study storage, one small file per trial.

A measurement costs minutes of restart and load; a storage write can fail (database locked
past its wait, disk full, read-only mount, the tuner killed between two writes). So the
outcome is written here first, atomically, and removed once the trial is COMPLETE in
storage. The next ``autotune run`` records what it finds here for trials still RUNNING
instead of measuring them again.

Files live in the study's run directory as ``journal/STORAGEKEY-TRIALID.json`` (mode 0600);
STORAGEKEY is a hash of the storage URL, so two storages sharing a run directory never
mix, and the URL itself (which may hold a password) is never written.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Entry:
    """One journaled measurement: the values, the constraints and the stored attributes."""

    values: list[float]
    constraints: dict[str, float]
    attrs: dict[str, Any] = field(default_factory=dict)


def _storage_key(storage_url: str, study_name: str) -> str:
    return hashlib.sha256(f"{storage_url}\0{study_name}".encode()).hexdigest()[:16]


class Journal:
    """Pending outcomes of one study in one storage."""

    def __init__(self, directory: Path, *, storage_url: str, study_name: str) -> None:
        self.directory = directory
        self._key = _storage_key(storage_url, study_name)

    def path(self, trial_id: int) -> Path:
        return self.directory / f"{self._key}-{trial_id}.json"

    def save(self, trial_id: int, *, number: int, outcome: Entry) -> Path:
        """Write (replace) the outcome of a trial; raises OSError when the disk refuses."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.path(trial_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        data = {
            "trial_id": trial_id,
            "number": number,
            "values": outcome.values,
            "constraints": outcome.constraints,
            "attrs": outcome.attrs,
        }
        text = json.dumps(data, default=str, allow_nan=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def load(self, trial_id: int) -> Entry | None:
        """The saved outcome, or None (absent, or torn by a crash before the rename)."""
        try:
            data: dict[str, Any] = json.loads(self.path(trial_id).read_text(encoding="utf-8"))
            return Entry(
                values=[float(v) for v in data["values"]],
                constraints={str(k): float(v) for k, v in data["constraints"].items()},
                attrs=dict(data["attrs"]),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def trial_ids(self) -> list[int]:
        """Trial ids with a saved outcome in this journal."""
        if not self.directory.is_dir():
            return []
        ids = []
        for path in self.directory.glob(f"{self._key}-*.json"):
            suffix = path.stem.rsplit("-", 1)[-1]
            if suffix.isdigit():
                ids.append(int(suffix))
        return sorted(ids)

    def discard(self, trial_id: int) -> None:
        self.path(trial_id).unlink(missing_ok=True)
