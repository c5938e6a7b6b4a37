"""A simulated SGLang server that needs credentials, as a real deployment's would.

``python keyed_server.py --api-key KEY [sim server flags]`` (or ``--api-key=KEY``) with
``HF_TOKEN`` in the environment: both must be the planted canaries, or it exits 3 (so a
study whose services received redacted values fails loudly). Like SGLang it prints its
parsed arguments, credentials included, to its log; then it runs ``autotune.sim.server``
with the remaining flags.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    args = sys.argv[1:]
    key = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        if args[i] == "--api-key" and i + 1 < len(args):
            key, i = args[i + 1], i + 2
            continue
        if args[i].startswith("--api-key="):
            key = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    token = os.environ.get("HF_TOKEN", "")
    if not (key or "").startswith("sk-CANARY") or not token.startswith("hf_CANARY"):
        print(f"keyed_server: wrong credentials (api key {key!r})", file=sys.stderr, flush=True)
        sys.exit(3)
    print(f"server_args=ServerArgs(api_key={key!r}, hf_token={token!r})", flush=True)
    sys.argv = ["autotune.sim.server", *rest]
    runpy.run_module("autotune.sim.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
