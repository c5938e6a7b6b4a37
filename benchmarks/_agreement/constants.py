"""What several of the modules share: the project root, the arms, their labels and pairs."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The project root (``benchmarks/agreement.py``'s ``REPO``)."""
TOOLS = ("autotune", "autotune_seed2", "autotune_replay", "vllm", "aiperf")
"""The arms a round can run; ``autotune_seed2`` and ``autotune_replay`` only in an open loop."""
LABELS = {
    "autotune": "autotune loadgen",
    "autotune_seed2": "autotune, other seed",
    "autotune_replay": "autotune on vLLM's schedule",
    "vllm": "vllm bench serve",
    "aiperf": "AIPerf",
}
PAIRS = (
    ("vllm", "autotune"),
    ("aiperf", "autotune"),
    ("autotune_seed2", "autotune"),
    ("vllm", "autotune_replay"),
)
"""(a, b): the table's differences, (a - b) / b. ``autotune_seed2`` vs ``autotune`` is one
tool's own spread between two arrival realizations at the same settings, the yardstick for
``vllm`` vs ``autotune``, whose arrivals differ too; ``vllm`` vs ``autotune_replay`` is the
cross-tool difference on one and the same arrival schedule."""
SEED2_OFFSET = 1000
"""``autotune_seed2`` runs with seed ``--seed + round + SEED2_OFFSET``."""
