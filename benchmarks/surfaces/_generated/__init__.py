"""The code of benchmarks/surfaces/generated.py, by concept (that file is the entry point)."""
