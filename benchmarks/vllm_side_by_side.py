"""autotune vs ``vllm bench sweep serve`` vs vLLM's defaults, on one real vLLM, same restarts.

The harness is the package ``benchmarks/side_by_side/`` (its docstring describes the arms);
this file is its command under the name the README, BENCHMARKS.md and benchmarks/agreement.md
give. From the project root:

    .venv/bin/python benchmarks/vllm_side_by_side.py --budget 20
    .venv/bin/python benchmarks/vllm_side_by_side.py --budget 2 --out /tmp/side-smoke   # smoke
    .venv/bin/python benchmarks/vllm_side_by_side.py --arms agreement   # reuses OUT/autotune

(the same as ``.venv/bin/python -m benchmarks.side_by_side ...``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.side_by_side.__main__ import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
