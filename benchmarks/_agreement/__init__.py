"""The code of benchmarks/agreement.py, by concept (the script is the entry point)."""
