"""Test doubles the trial-pipeline tests share."""

from __future__ import annotations


class Reference:
    """The pipeline's reference-output store (correctness checks), held in memory."""

    def __init__(self) -> None:
        self.text: str | None = None

    def get(self) -> str | None:
        return self.text

    def set(self, text: str) -> None:
        self.text = text
