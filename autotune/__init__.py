"""autotune: Bayesian configuration search for LLM serving deployments."""

from __future__ import annotations

__version__ = "0.1.0"
