"""Which kinds of GPU a study's runs came from, and saying so when a new kind joins them.

A study resumed on lent or shared hardware may get another card than the one it started on:
issue 28's dense random-search arm ran 13 runs on H200s and, when no H200 came, its last 6
launches on H100s, which serve the same configuration 8-12% slower. Every measurement
records its GPUs (:attr:`autotune.telemetry.Telemetry.card`), but a ranking that mixes kinds
compares the cards as much as the configurations, and nothing said so while the study ran.
:class:`CardWatch` knows the kinds the stored runs recorded (trials and re-measurements) and,
the first time a run comes from another kind, gives the line ``autotune run`` prints:
``best`` counts the runs per kind, ``autotune explain`` reads the GPU as a block.
"""

from __future__ import annotations

from collections import Counter

import optuna

from autotune.results import study_cards


class CardWatch:
    """The kinds of GPU seen so far, with their run counts."""

    def __init__(self, seen: dict[str, int] | None = None) -> None:
        self.seen: Counter[str] = Counter(seen or {})

    @classmethod
    def from_study(cls, study: optuna.Study) -> CardWatch:
        """The kinds the study's stored runs recorded (none for a study on CPUs, or one
        from before GPU telemetry)."""
        return cls(study_cards(study))

    def observe(self, card: str | None, *, run: str) -> str | None:
        """Count a finished run's kind; the warning to print the first time a kind joins a
        study whose earlier runs came from others (``run``: how the warning names the run,
        "the run of #7").
        None for a run without GPU telemetry, a kind seen before, or the study's first."""
        if card is None:
            return None
        new = card not in self.seen
        earlier = ", ".join(f"{kind} ({n})" for kind, n in self.seen.most_common())
        self.seen[card] += 1
        if not new or not earlier:
            return None
        return (
            f"warning: {run} ran on {card}; the study's earlier runs on {earlier}: its "
            "ranking now compares kinds of GPU as well as configurations (`autotune best` "
            "counts the runs of each; `autotune explain` reads the GPU as a block)"
        )
