"""The pieces of ``benchmarks/sample_efficiency.py`` (its entry point, which re-exports them)."""
