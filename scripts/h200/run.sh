#!/usr/bin/env bash
# autotune on the offline H200 machine, one device call at a time (README, "Tuning vLLM on a
# GPU"; issue 7's transformers serve study used the same verbs).
#
# vLLM 0.26.0 (issue 28). Here, once: python3 scripts/h200/kit.py build vllm-0.26.0
# Then one device call per part, back to back (the machine stays warm 30 s between calls):
#   carry [".kit/vllm-0.26.0/kit.json", ".kit/vllm-0.26.0/part-01"]:  scripts/h200/run.sh kit
#   ... part-02 ...
#   carry [... "part-03"]:  scripts/h200/run.sh kit models failures start watch 420
# (three parts since the kit is xz'd, 125.7 MiB: `kit.py plan vllm-0.26.0` lists the calls)
#   (next calls, no carry)  scripts/h200/run.sh watch 540
# and STUDY=vllm-h200-moe scripts/h200/run.sh start watch 540 for the MoE study.
#
# transformers serve (issue 7): scripts/h200/fetch-wheels.sh here, then carry [".whl"] and
#   STUDY=transformers-serve-h200 MODELS=h200-2.8b:/tmp/autotune-model scripts/h200/run.sh \
#     prepare models start watch 420
#
# The device tool limits one command to 10 minutes and a session to 30 minutes of machine time,
# so `start` runs `autotune run` in its own process session (it outlives the call while the
# machine stays warm) and every `watch` ends by copying a consistent snapshot of the study
# database, the HTML report, `autotune best` and the logs to $OUT. If the machine is lost, the
# run resumes from the last snapshot: put it back at studies/NAME.db and call `start` again
# (FROM_DB does that when studies/NAME.db is missing).
#
# Verbs, run in order:
#   kit            receive the carried part of $KIT, install the kit into $SITE once complete
#                  (exit 3 while parts are missing: the next call carries the next part)
#   prepare        install carried .whl/*.whl into $SITE (transformers serve's wheels)
#   models         build the random-weight models of $MODELS (PRESET:DIR ...), check the GPU
#   failures       start vLLM with the configurations of $FAILURES (NAME|ARGS lines) and keep
#                  each one's log, unedited, in $OUT/failures.tar (tests/engines/data/)
#   start          start (or resume) the study in the background
#   explain        start (or resume) `autotune explain` of the study's winner in the background
#                  ($EXPLAIN_ARGS: its options)
#   budget         start (or resume) the study in the background until it has spent $RESTARTS
#                  server restarts as the side-by-side counts them (launched trials, then the
#                  study's re-measurements; reused and forbidden trials start nothing):
#                  `python3 -m benchmarks.side_by_side --arms autotune --autotune-storage ...`
#   sweep          start (or resume) `vllm bench sweep serve` over $SWEEP_SEQS x $SWEEP_TOKENS
#                  ($SWEEP_RUNS runs each) with $STUDY's serve command and load, in the
#                  background: `python3 -m benchmarks.side_by_side --arms sweep --resume ...`
#   agreement      start autotune's winner of $WINNER_DB once, then autotune's load generator and
#                  `vllm bench serve` alternating on it ($ROUNDS each), in the background
#   check          queue defaults, hand-picked and the winner of $WINNER_DB into the check study
#                  $STUDY (scripts/h200/side_by_side.py, once), and trial N of the tuning study
#                  for each N of $ALSO (an existing check study too, once), then `autotune run`
#                  of it ($CHECK_TRIALS trials, the top three measured three times, or
#                  CHECK_REPEATS+1 times) in the background
#   profile        start vLLM once on $PROFILE_MODEL ($PROFILE_ARGS: its options) under py-spy
#                  (carried .kit/py-spy/py_spy-*.whl) until it listens, then stop it; the raw
#                  stacks of every process (startup-profile.raw.gz), where its start went
#                  (startup-profile.md, scripts/h200/startup_profile.py), its log and process
#                  tree; once per word of $PROFILE_ENVS (`default` or VAR=VALUE[,VAR=VALUE])
#                  when it has several, as startup-profile-N-WORD.*; all in one file,
#                  $OUT/startup-profile.tar.gz (the device call returns 8 files at most, and a
#                  study's `collect` needs 6 of them)
#   watch SECONDS  wait until the background job ends or SECONDS pass, then collect (never
#                  past $CALL_S - $COLLECT_S seconds from the call's start: `watch 600` is the
#                  longest a call allows)
#   collect        snapshot the database, write the report and `best` into $OUT; tar the
#                  side-by-side directory ($SIDE_DIR: the sweep's JSON results and logs, the
#                  agreement's runs, results.json) into $OUT/$STUDY-side-by-side.tar.gz
#   pack           move what $OUT holds into one $OUT/$STUDY-collect.tar.gz (earlier packs
#                  stay): a call returns 8 files at most and `collect` writes 6, so a call
#                  that collects two studies packs the first (`... watch 300 pack`)
#
# Issue 28 part 5, the side-by-side on the H200, over as many device sessions as it takes (one
# GPU: one background job at a time; every verb that starts one refuses while another runs).
# A session begins with the kit (3 calls) and the 7B model; the arms resume from what the last
# session's `collect` returned, copied here under benchmarks/h200/ (tracked or not, files there
# travel with the working tree: no carry needed beyond the kit's part):
#   $OUT/vllm-h200-dense-random.db -> benchmarks/h200/vllm-h200-dense-random.db  (FROM_DB=)
#   $OUT/vllm-h200-dense-check.db  -> benchmarks/h200/vllm-h200-dense-check.db   (FROM_DB=)
#   $OUT/vllm-h200-dense-side-by-side.tar.gz -> benchmarks/h200/ (restored into $SIDE_DIR
#       by sweep/agreement when $SIDE_DIR is missing: SIDE_FROM, that path by default)
# and `.venv/bin/python benchmarks/h200_side_by_side.py` prints BENCHMARKS.md's table from them.
#   random search to 20 restarts (the TPE study's: 18 launched trials + 2 re-measurements;
#   done 2026-12-07, its last 6 launches on two H100s with CARD=any when no H200 came):
#     carry [".kit/vllm-0.26.0/kit.json", ".kit/vllm-0.26.0/part-03"]:
#     STUDY=vllm-h200-dense-random FROM_DB=benchmarks/h200/vllm-h200-dense-random.db \
#       MODELS=h200-7b:/tmp/autotune-model-7b RESTARTS=20 scripts/h200/run.sh kit models budget watch 600
#     STUDY=vllm-h200-dense-random scripts/h200/run.sh watch 540        (next calls)
#   the sweep (20 combinations x 3 runs, ~3-4 min each: 3-4 sessions):
#     MODELS=h200-7b:/tmp/autotune-model-7b scripts/h200/run.sh kit models sweep watch 420
#     scripts/h200/run.sh watch 540                                      (next calls)
#   defaults x3, hand-picked and the winner, from fresh starts (9 restarts):
#     STUDY=vllm-h200-dense-check [FROM_DB=benchmarks/h200/vllm-h200-dense-check.db] \
#       MODELS=h200-7b:/tmp/autotune-model-7b scripts/h200/run.sh kit models check watch 420
#   the winner by both clients on one fresh start:
#     MODELS=h200-7b:/tmp/autotune-model-7b scripts/h200/run.sh kit models agreement watch 420
#   a CUDA-graph capture out of memory (its log for tests/engines/data/vllm-0.26.0/):
#     FAILURES=scripts/h200/failures-vllm-0.26.0-capture.txt \
#       MODELS=h200-7b:/tmp/autotune-model-7b scripts/h200/run.sh kit models failures
#   `autotune explain` of the dense winner, what each change bought, borrowing the check
#   study's 9 fresh-start runs (defaults, hand-picked and the winner, 3 each: `explain
#   --runs-from`) and the study's own exact reverts #23 (fp8 weights) and #24 (fp8 KV), one
#   run each (`--own-runs`), so the 7 reverts take 12 restarts and the winner 1 (the anchor
#   beside the check's runs: the drift between occasions measured), 13 in all, not 18; over
#   two sessions on two GPUs, 24 where the second reads apart from the first (its runs are
#   then left out and everything measured on the second: BENCHMARKS.md, "Two sessions")
#   (then the same without --no-minimal adds the minimal search, ~9 more: benchmarks/explain_borrow.py):
#     STUDY=vllm-h200-dense FROM_DB=benchmarks/h200/vllm-h200-dense.db \
#       EXPLAIN_ARGS="--repeats 2 --no-path --no-minimal --own-runs --runs-from vllm-h200-dense-check \
#         --runs-from-storage sqlite:///benchmarks/h200/vllm-h200-dense-check.db" \
#       MODELS=h200-7b:/tmp/autotune-model-7b scripts/h200/run.sh kit models explain watch 420
#   On an H100 instead (done 2026-12-07: each of the 7 reverts twice on two H100s, 15
#   restarts, borrowing the H100 check's 9 runs; BENCHMARKS.md "The H200 winner explained on
#   an H100"), on a copy of the tuning study kept apart: $OUT/vllm-h200-dense.db ->
#   benchmarks/h100/vllm-h200-dense-explain-h100.db. Its last session's two calls (after the
#   kit's first two; `kit models` only in the first):
#     CARD=any STUDY=vllm-h200-dense FROM_DB=benchmarks/h100/vllm-h200-dense-explain-h100.db \
#       EXPLAIN_ARGS="--repeats 1 --no-path --no-minimal --runs-from vllm-h200-dense-check \
#         --runs-from-storage sqlite:///benchmarks/h100/vllm-dense-check-h100.db" \
#       MODELS=h200-7b:/tmp/autotune-model-7b CALL_S=560 scripts/h200/run.sh kit models explain watch 600
#     then EXPLAIN_ARGS="--repeats 2 ..." ... scripts/h200/run.sh explain watch 600
#   #19 of the dense study (cut by the faulty early abort) and the random arm's winner, from
#   fresh starts in the check study (ALSO: N of the tuning study, STUDY:N or STUDY:best, the
#   latter from studies/STUDY.db when this machine has it, else benchmarks/h200/STUDY.db;
#   CHECK_TRIALS counts the study's completed trials, 3 so far):
#     STUDY=vllm-h200-dense-check FROM_DB=benchmarks/h200/vllm-h200-dense-check.db \
#       ALSO="vllm-h200-dense-random:best 19" CHECK_TRIALS=5 \
#       MODELS=h200-7b:/tmp/autotune-model-7b scripts/h200/run.sh kit models check
#   (done 2026-12-07 on a third H200, then two more rounds of the top three so that each has
#   runs on that GPU: `CHECK_REPEATS=3 ... check watch 600`, then CHECK_REPEATS=4; that day
#   the study file was edited on the machine instead, which CHECK_REPEATS does since)
#   the MoE model: the same arms at the issue's floor of 16 restarts each (RESTARTS=16; the
#     reader: benchmarks/h200_side_by_side.py --study vllm-h100-moe --budget 16), with
#     MODELS=h200-moe:/tmp/autotune-moe, on an H100 (the device tool lends one when no H200
#     comes; the vllm-h100-moe studies keep their results in benchmarks/h100/ and refuse any
#     other card): STUDY=vllm-h100-moe budget (TPE), STUDY=vllm-h100-moe-random budget,
#     STUDY=vllm-h100-moe sweep (16 evenly spaced grid points), then STUDY=vllm-h100-moe-check
#     check and the agreement. All of them are done (BENCHMARKS.md, "sixth session"): an arm
#     went on from its snapshot (the sweep from benchmarks/h100/vllm-h100-moe-side-by-side.tar.gz,
#     the finished points not run again), and the call in which the sweep ended started the
#     check study behind it:
#     t0=$SECONDS; STUDY=vllm-h100-moe RESTARTS=16 MODELS=h200-moe:/tmp/autotune-moe \
#       CALL_S=590 scripts/h200/run.sh kit models sweep watch 600 pack; \
#       STUDY=vllm-h100-moe-check CALL_S=$((585 - SECONDS + t0)) scripts/h200/run.sh check watch 600
#     (random search's winner is vLLM's defaults, so the check's three configurations are all),
#     then STUDY=vllm-h100-moe ROUNDS=2 CALL_S=285 scripts/h200/run.sh agreement watch 600 pack.
#     Then `autotune explain` of its winner (two levers from the defaults; done 2026-12-07,
#     BENCHMARKS.md "The MoE winner explained on an H100": 3 restarts in 265 s). All 9 runs of the
#     check study are borrowable (the winner's and the defaults' 3 each, and the hand-picked
#     fp8 weights, which is the winner with prefix caching reverted), so only the revert of fp8
#     is measured, and the winner once (the anchor beside the check's runs): 3 restarts,
#     about 4 minutes (not --own-runs, which would lend the
#     tuning study's #17, that revert, 7,855 tok/s: measured on the tuning sessions' H100s,
#     whose defaults ran 17% below the check's, so it would pass a machine's drift off as
#     fp8's gain):
#     STUDY=vllm-h100-moe FROM_DB=benchmarks/h100/vllm-h100-moe.db \
#       EXPLAIN_ARGS="--repeats 2 --no-path --no-minimal --runs-from vllm-h100-moe-check \
#         --runs-from-storage sqlite:///benchmarks/h100/vllm-h100-moe-check.db" \
#       MODELS=h200-moe:/tmp/autotune-moe CALL_S=420 scripts/h200/run.sh kit models explain watch 600
#     and its fp8 lever decided with the GPU as a block (done 2026-12-07, BENCHMARKS.md "The
#     MoE winner explained on an H100"): the same with EXPLAIN_ARGS="--repeats 3 ..." on the
#     next H100, 2 restarts (the fp8 revert and the winner beside each other; CALL_S=385
#     COLLECT_S=40 fit it in 280 s with the kit and the model), then
#     .venv/bin/python benchmarks/h200_side_by_side.py --study vllm-h100-moe --budget 16
#     (the same arms as vllm-h200-moe* on an H200, if a whole side-by-side fits there).
#   On an H200, when one comes (a call naming nvidia-h200 gets an H100 or nothing most days;
#     needs_h200 is for work that cannot fit an H100, which this MoE does): the H100's winner
#     beside vLLM's defaults and the hand-picked fp8 weights on that H200, 3 fresh starts each
#     (9 restarts, about 15 minutes: one lease). The queue, checked on the CPU machine on
#     2026-12-08: defaults, hand-picked, and #23 of benchmarks/h100/vllm-h100-moe.db.
#     With part-03 of the kit:
#     STUDY=vllm-h200-moe-check WINNER_STUDY=vllm-h100-moe \
#       WINNER_DB=benchmarks/h100/vllm-h100-moe.db MODELS=h200-moe:/tmp/autotune-moe \
#       scripts/h200/run.sh kit models check watch 600
#     then STUDY=vllm-h200-moe-check scripts/h200/run.sh watch 600 until its 9 runs are in.
# Where a restart's first 40-50 s go (before vLLM's engine core logs its first line; one start,
# 1-2.5 min of device time): here, once, `python3 -m pip download --no-deps py-spy==0.4.3 -d
# .kit/py-spy`; then, after the kit and the models, carry [..., ".kit/py-spy"] and
#     PROFILE_MODEL=/tmp/autotune-moe scripts/h200/run.sh ... models profile ...
# and what a forked engine core saves (its second import of vLLM: 17.4 s on the H100; the CLI,
# and this script, spawn it, so `default` is spawn; four eager starts, about 4 minutes;
# BENCHMARKS.md "A real vLLM's start, profiled"):
#     PROFILE_ARGS=--enforce-eager PROFILE_ENVS="default VLLM_WORKER_MULTIPROC_METHOD=fork \
#       default VLLM_WORKER_MULTIPROC_METHOD=fork" scripts/h200/run.sh ... models profile ...
# `watch` returns as soon as the background job ends, so one call can start the next arm the
# moment the last one is done: `scripts/h200/run.sh watch 420 agreement watch 160` (a verb that
# finds a job still running says so and starts nothing). Two studies in one call: two commands,
# `scripts/h200/run.sh watch 300 pack; STUDY=... scripts/h200/run.sh budget watch 280`.
set -uo pipefail
cd "$(dirname "$0")/../.."

STUDY=${STUDY:-vllm-h200-dense}
TRIALS=${TRIALS:-24}
KIT=${KIT:-vllm-0.26.0}
SITE=${SITE:-/tmp/site}
MODELS=${MODELS:-tiny:/tmp/autotune-tiny tiny-moe:/tmp/autotune-tiny-moe h200-7b:/tmp/autotune-model-7b h200-moe:/tmp/autotune-moe}
FAILURES=${FAILURES:-scripts/h200/failures-$KIT.txt}
OUT=${OUT:-/tmp/autotune-out}
PY=${PY:-python3}
# The background jobs' logs and pid files (LOGS: elsewhere for the tests, which run beside
# each other and must not see each other's jobs as this machine's one GPU being busy).
LOGS=${LOGS:-studies/logs}
LOG=$LOGS/$STUDY-run.log
PIDFILE=$LOGS/$STUDY-run.pid
# The side-by-side harness (benchmarks/side_by_side): its directory, log and process.
SIDE_DIR=studies/artifacts/side-by-side/$STUDY
# Where this card's returned results are kept here: a study named *-h100-* runs on an H100 and
# keeps them in benchmarks/h100/, every other in benchmarks/h200/. CARD: the GPU the study needs.
case $STUDY in
  *-h100-*) RESULTS=${RESULTS:-benchmarks/h100}; CARD=${CARD:-H100} ;;
  *) RESULTS=${RESULTS:-benchmarks/h200}; CARD=${CARD:-H200} ;;
esac
SIDE_FROM=${SIDE_FROM:-$RESULTS/$STUDY-side-by-side.tar.gz}
SIDE_LOG=$SIDE_DIR/harness.log
SIDE_PID=$LOGS/$STUDY-side.pid
RESTARTS=${RESTARTS:-20}
SWEEP_SEQS=${SWEEP_SEQS:-64,128,256,512,1024}
SWEEP_TOKENS=${SWEEP_TOKENS:-2048,4096,8192,16384}
SWEEP_RUNS=${SWEEP_RUNS:-3}
ROUNDS=${ROUNDS:-3}
# The device call's limit in seconds from this script's start (the device tool's timeout_s,
# at most 600): every `watch` ends in time to collect within it.
CALL_S=${CALL_S:-595}
COLLECT_S=${COLLECT_S:-30}
CHECK_TRIALS=${CHECK_TRIALS:-3}
PROFILE_MODEL=${PROFILE_MODEL:-/tmp/autotune-moe}
PROFILE_ARGS=${PROFILE_ARGS:-}
PROFILE_RATE=${PROFILE_RATE:-20}
PROFILE_ENVS=${PROFILE_ENVS:-default}
WINNER_STUDY=${WINNER_STUDY:-${STUDY%-check}}
WINNER_DB=${WINNER_DB:-$RESULTS/$WINNER_STUDY.db}
export PYTHONPATH=$SITE:$PWD
export PYTHONUNBUFFERED=1
# vLLM without flashinfer (not in the kit): its top-k/top-p sampler falls back to PyTorch.
export VLLM_USE_FLASHINFER_SAMPLER=0
# One torch.compile / CUDA-graph cache for every trial of the machine: vLLM keys its entries by
# a hash of the configuration, so a restart with a configuration seen before loads instead of
# compiling (start-up 47-134 s cold, DOMAIN.md §8b).
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/var/tmp/autotune-vllm-cache}
# vLLM's engine core is spawned, as vLLM's CLI does when VLLM_WORKER_MULTIPROC_METHOD is unset
# (cli_env_setup in vllm/entrypoints/serve/utils/api_utils.py). Forked, it skips a second import
# of vLLM, 17.4 s of every start on the H100 (BENCHMARKS.md "A real vLLM's start, profiled"),
# but the first two forked runs under load came out below their spawned twins (#17 of the MoE
# study 6,581.6 against 7,855.2 tok/s, the defaults 6,827.1 against 7,052.1), and every arm of
# a side-by-side must start its servers as vLLM's defaults are measured: so spawn, unless the
# caller sets VLLM_WORKER_MULTIPROC_METHOD=fork (the MoE random arm's last restarts do, as its
# first 12 ran so). Trials record what their services inherit from this script's environment
# (trial schema 8, `inherited_env`: VLLM_WORKER_MULTIPROC_METHOD, VLLM_USE_FLASHINFER_SAMPLER,
# VLLM_CACHE_ROOT, ...): `best` shows it, and a session whose variables differ from the newest
# trial's says so as it starts (trials stored before schema 8 recorded none: no judgement).
mkdir -p "$LOGS" "$OUT"

say() { printf '[%s] %s\n' "$(date -u +%T)" "$*"; }

kit() {
  "$PY" scripts/h200/kit.py install "$KIT" --target "$SITE"
  local rc=$?
  [ $rc -eq 3 ] && say "kit incomplete: send the next part"
  return $rc
}

prepare() {
  if [ ! -f "$SITE/.installed" ]; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
      say "no wheels in .whl/: run scripts/h200/fetch-wheels.sh on the machine with network, and carry .whl"
      return 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl || return 1
    touch "$SITE/.installed"
  fi
}

models() {
  local t0=$SECONDS entry gpu
  # The arms of one side-by-side never mix cards: an H200 study refuses an H100 and the other
  # way round (CARD=any for a deliberate cross-card check, such as the dense check on an H100).
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  if [ "$CARD" != any ] && [[ $gpu != *"$CARD"* ]]; then
    say "$STUDY runs on an $CARD; this machine has $gpu: nothing started (CARD=any to run it anyway)"
    return 4
  fi
  "$PY" -c 'import sys, torch, transformers; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, GPU {torch.cuda.get_device_name(0)}")' || return 1
  for entry in $MODELS; do
    "$PY" scripts/build_model.py --preset "${entry%%:*}" --out "${entry#*:}" || return 1
  done
  [ "$KIT" = "vllm-0.26.0" ] && { "$PY" scripts/h200/moe_configs.py || return 1; }
  nvidia-smi --query-gpu=name,memory.total,memory.used,power.limit,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -5
  say "models ready in $((SECONDS - t0)) s"
}

# A server listens on 127.0.0.1:PORT (uvicorn listens once start-up is complete; no curl on
# the GPU image is assumed).
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Each line of $FAILURES: WAVE|NAME|MODEL_DIR|vLLM OPTIONS|ENV=VALUE ... The lines of a wave
# start together, the waves one after another. A server is given 240 s to fail or come up (one
# that comes up is stopped and noted: then it was not a start-up failure).
failures() {
  local dir=/tmp/autotune-failures wave name model args envs port=18100 pids=() current=""
  rm -rf "$dir"; mkdir -p "$dir"
  finish_wave() {
    local pid
    for pid in "${pids[@]}"; do wait "$pid"; done
    pids=()
  }
  one() {  # name model port args envs (run in the background: its own shell)
    local t0=$SECONDS pid
    set -f  # the options' JSON ([1,2,4,8]) is no file pattern
    # shellcheck disable=SC2086
    env $5 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
      timeout 240 "$PY" -m vllm.entrypoints.openai.api_server --model "$2" \
        --host 127.0.0.1 --port "$3" $4 >"$dir/$1.log" 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null; do
      if listening "$3"; then
        echo "[autotune] the server came up: not a start-up failure" >>"$dir/$1.log"
        kill $pid; break
      fi
      sleep 2
    done
    wait $pid; echo "[autotune] exit status $?" >>"$dir/$1.log"
    say "$1: $((SECONDS - t0)) s: $(grep -m1 -E '[A-Za-z_.]+Error|Value error,|error: ' "$dir/$1.log" | cut -c1-200)"
  }
  while IFS='|' read -r wave name model args envs; do
    [ -z "$wave" ] || [ "${wave:0:1}" = "#" ] && continue
    [ "$wave" != "$current" ] && { finish_wave; current=$wave; }
    # The JSON values hold no spaces, so word splitting keeps each one whole.
    one "$name" "$model" $port "$args" "$envs" &
    pids+=($!)
    port=$((port + 1))
  done <"$FAILURES"
  finish_wave
  tar -C "$dir" -cf "$OUT/failures.tar" .
}

# py-spy samples every process of one start (the API server and the engine core it starts), main
# threads and idle time included, from its launch until the server listens; then the server is
# stopped (py-spy writes its file when its child exits). $PROFILE_ENVS: one start per word, each
# `default` (the environment as it is) or VAR=VALUE[,VAR=VALUE] set for that start only, in
# that order (`default VLLM_WORKER_MULTIPROC_METHOD=fork default VLLM_WORKER_MULTIPROC_METHOD=fork`
# compares the engine core spawned, vLLM's CLI default and this script's, with forked, twice,
# alternating).
profile() {
  local whl dir=/tmp/autotune-py-spy variant i=0 n name rc=0
  local pyspy=${PYSPY:-$dir/bin/py-spy}  # PYSPY: a py-spy already installed (the tests')
  if busy; then say "not profiled: another job runs (one GPU)"; return 0; fi
  if [ ! -x "$pyspy" ]; then
    whl=$(ls .kit/py-spy/py_spy-*.whl 2>/dev/null | head -1)
    if [ -z "$whl" ]; then
      say "no .kit/py-spy/py_spy-*.whl: download it here and carry .kit/py-spy"; return 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --target "$dir" "$whl" || return 1
  fi
  n=$(wc -w <<<"$PROFILE_ENVS")
  # The files of every start go to $OUT/startup-profile/ (what a call cut off at its limit
  # still returns), then into one archive: the device call returns 8 files at most.
  local files=$OUT/startup-profile
  mkdir -p "$files"
  for variant in $PROFILE_ENVS; do
    i=$((i + 1))
    name=startup-profile
    [ "$n" -gt 1 ] && name=startup-profile-$i-${variant//[^A-Za-z0-9_.-]/_}
    profile_one "$pyspy" "$variant" "$name" "$files" || { rc=1; break; }
  done
  tar -czf "$OUT/startup-profile.tar.gz" -C "$files" . && rm -rf "$files" &&
    say "startup profiles: $OUT/startup-profile.tar.gz"
  return $rc
}

profile_one() {
  local pyspy=$1 variant=$2 name=$3 port=${PROFILE_PORT:-18300} spy server t0=$SECONDS ready=""
  local out=$4  # where this start's files go
  local -a extra=()
  [ "$variant" != default ] && IFS=, read -r -a extra <<<"$variant"
  rm -f "$out/$name.raw" "$out/$name.raw.gz"
  local -a group=()
  # a process group of its own (setsid execs in place: py-spy's pid is the group's), so that
  # whatever of this start outlives it goes with it below
  command -v setsid >/dev/null && group=(setsid)
  set -f
  # shellcheck disable=SC2086
  "${group[@]}" env CUDA_VISIBLE_DEVICES=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    "${extra[@]}" \
    "$pyspy" record --subprocesses --idle --threads --rate "$PROFILE_RATE" \
      --format raw -o "$out/$name.raw" -- \
      "$PY" -m vllm.entrypoints.openai.api_server --model "$PROFILE_MODEL" \
        --host 127.0.0.1 --port $port $PROFILE_ARGS >"$out/$name.log" 2>&1 &
  set +f
  spy=$!
  while kill -0 $spy 2>/dev/null && [ $((SECONDS - t0)) -lt 400 ]; do
    if listening $port; then ready=$((SECONDS - t0)); break; fi
    sleep 1
  done
  # py-spy's child, the API server, from the kernel (procps' pgrep may not be on the image)
  server=$(cat /proc/$spy/task/*/children 2>/dev/null | awk '{print $1; exit}')
  # when it and each process under it started (py-spy's stacks carry no time)
  [ -n "$server" ] && "$PY" scripts/h200/startup_profile.py --procs-of "$server" >"$out/$name.procs"
  [ -n "$server" ] && kill -TERM "$server"
  wait $spy
  # Left over: a py-spy that failed to attach exits and leaves its child, a server on the GPU
  # that the next verb's study would find holding the memory and the port.
  if kill -0 -- -$spy 2>/dev/null; then
    say "stopping what is left of the profiled start (process group $spy)"
    kill -TERM -- -$spy 2>/dev/null
    local waited=0
    while kill -0 -- -$spy 2>/dev/null && [ $waited -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
    kill -KILL -- -$spy 2>/dev/null
  fi
  # the port is free again before the next start
  while listening $port && [ $((SECONDS - t0)) -lt 460 ]; do sleep 1; done
  local outcome="never listened"
  [ -n "$ready" ] && outcome="$ready s to listen"
  say "profiled start [$variant]: $outcome ($((SECONDS - t0)) s with the stop)"
  [ -s "$out/$name.raw" ] || { tail -5 "$out/$name.log"; return 1; }
  local -a procs=()
  [ -s "$out/$name.procs" ] && procs=(--procs "$out/$name.procs")
  "$PY" scripts/h200/startup_profile.py "$out/$name.raw" --rate "$PROFILE_RATE" "${procs[@]}" \
    >"$out/$name.md" && sed -n '1,/^## pid/p' "$out/$name.md" | head -20
  gzip -f "$out/$name.raw"
}

# One GPU: one background job at a time, whatever study it is for.
busy() {
  local f
  for f in "$LOGS"/*.pid; do
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && { say "running: ${f##*/} (pid $(cat "$f"))"; return 0; }
  done
  return 1
}

running() { busy >/dev/null; }

from_db() {
  if [ ! -f "studies/$STUDY.db" ] && [ -n "${FROM_DB:-}" ]; then
    cp "$FROM_DB" "studies/$STUDY.db" && say "study copied from $FROM_DB"
  fi
}

background() {
  if busy; then say "not started: another job runs"; return 0; fi
  from_db
  say "autotune $*"
  setsid nohup "$PY" -m autotune "$@" >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
}

# The side-by-side harness in the background, on $STUDY's deployment and load, with this
# machine's vLLM (a dist named vllm: `python3 -m vllm.entrypoints.cli.main`), resuming $SIDE_DIR.
side() {
  if busy; then say "not started: another job runs"; return 0; fi
  if [ ! -d "$SIDE_DIR" ] && [ -f "$SIDE_FROM" ]; then
    mkdir -p "$SIDE_DIR" && tar -xzf "$SIDE_FROM" -C "$SIDE_DIR" && say "restored $SIDE_DIR from $SIDE_FROM"
  fi
  mkdir -p "$SIDE_DIR"
  say "side by side: $*"
  setsid nohup "$PY" -m benchmarks.side_by_side --study "studies/$STUDY.yaml" --out "$SIDE_DIR" \
    --vllm-python "$PY" --vllm-cli module --budget "$RESTARTS" --resume "$@" \
    >>"$SIDE_LOG" 2>&1 </dev/null &
  echo $! >"$SIDE_PID"
}

start() { background run --study "$STUDY" --trials "$TRIALS"; }

explain() {
  # shellcheck disable=SC2086
  background explain --study "$STUDY" ${EXPLAIN_ARGS:-}
}

budget() {
  from_db
  side --arms autotune --autotune-storage "sqlite:///studies/$STUDY.db"
}

sweep() {
  side --arms sweep --sweep-seqs "$SWEEP_SEQS" --sweep-tokens "$SWEEP_TOKENS" \
    --sweep-runs "$SWEEP_RUNS"
}

agreement() {
  side --arms agreement --rounds "$ROUNDS" --winner-from "sqlite:///$PWD/$WINNER_DB" \
    --winner-study "$WINNER_STUDY"
}

check() {
  if busy; then say "not started: another job runs"; return 0; fi
  from_db
  local also=() n
  for n in ${ALSO:-}; do also+=(--also "$n"); done  # N, STUDY:N or STUDY:best
  if [ ! -f "studies/$STUDY.db" ] || [ ${#also[@]} -gt 0 ]; then
    "$PY" scripts/h200/side_by_side.py --study "$STUDY" --winner-study "$WINNER_STUDY" \
      --winner-from "sqlite:///$PWD/$WINNER_DB" "${also[@]}" || return 1
  fi
  # CHECK_REPEATS=N: N re-measurements of each of the top configurations instead of the study
  # file's remeasure.repeats: more rounds of a check study already measured (it re-measures
  # only what is missing), from a copy of the study file beside it (its paths are relative).
  local file=()
  if [ -n "${CHECK_REPEATS:-}" ]; then
    if ! [[ $CHECK_REPEATS =~ ^[1-9][0-9]?$ ]]; then
      say "CHECK_REPEATS=$CHECK_REPEATS: expected a number of re-measurements, 1-99"
      return 1
    fi
    file=("studies/.$STUDY-repeats-$CHECK_REPEATS.yaml")
    sed "s/^  repeats: [0-9][0-9]*\$/  repeats: $CHECK_REPEATS/" "studies/$STUDY.yaml" >"${file[0]}"
    grep -q "^  repeats: $CHECK_REPEATS\$" "${file[0]}" || {
      say "studies/$STUDY.yaml: no remeasure.repeats line to change"
      return 1
    }
    file=(--study-file "${file[0]}")
  fi
  background run --study "$STUDY" --trials "$CHECK_TRIALS" "${file[@]}"
}

watch() {
  # The device tool kills a call at its limit, and a watch that is killed never collects: the
  # call's snapshot is lost (it happened when `kit models sweep watch 530` spent 76 s before
  # the watch began). So a watch ends COLLECT_S before the call's CALL_S, whatever it asked.
  local want=${1:-540} left f
  left=$((CALL_S - COLLECT_S - SECONDS))
  if [ "$want" -gt "$left" ]; then
    [ $left -lt 0 ] && left=0
    say "watch $want cut to $left s: the call ends at $CALL_S s (CALL_S), collect needs $COLLECT_S s"
    want=$left
  fi
  local end=$((SECONDS + want))
  while running && [ $SECONDS -lt $end ]; do sleep 5; done
  if running; then say "still running after the watch"; else say "the run has ended"; fi
  for f in "$LOG" "$SIDE_LOG"; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 40 "$f"; }
  done
  collect
}

collect() {
  if [ -f "studies/$STUDY.db" ]; then
    "$PY" - "$STUDY" "$OUT" <<'EOF'
import sqlite3, sys
study, out = sys.argv[1], sys.argv[2]
src = sqlite3.connect(f"studies/{study}.db", timeout=60)
dst = sqlite3.connect(f"{out}/{study}.db")
with dst:
    src.backup(dst)  # consistent even while the run writes
print(f"snapshot: {out}/{study}.db")
EOF
    "$PY" -m autotune report --study "$STUDY" --out "$OUT/$STUDY.html" 2>&1 | tail -2
    {
      "$PY" -m autotune status --study "$STUDY"
      "$PY" -m autotune best --study "$STUDY"
      "$PY" -m autotune explain --study "$STUDY" --show || true
    } >"$OUT/best.txt" 2>&1
  fi
  [ -f "$LOG" ] && cp "$LOG" "$OUT/run.log"
  # The side-by-side's results: the sweep's JSON and log (every session's), the agreement's
  # runs, results.json, the harness's log; not the run directories (servers' temporary files).
  if [ -d "$SIDE_DIR" ]; then
    tar -czf "$OUT/$STUDY-side-by-side.tar.gz" -C "$SIDE_DIR" --exclude=run . &&
      say "side by side: $OUT/$STUDY-side-by-side.tar.gz ($(du -h "$OUT/$STUDY-side-by-side.tar.gz" | cut -f1))"
  fi
  # The server's log of the newest trials (the run directory keeps one per service).
  local since=$PIDFILE
  [ -f "$since" ] || since=$SIDE_PID
  find studies/runs -name '*.log' -newer "$since" -print0 2>/dev/null |
    xargs -0 -r ls -t | head -3 | xargs -r tail -n 150 >"$OUT/serve-tail.log" 2>/dev/null
  ls -la "$OUT"
}

pack() {
  local files=()
  mapfile -t files < <(find "$OUT" -maxdepth 1 -type f ! -name '*-collect.tar.gz' -printf '%f\n' | sort)
  [ ${#files[@]} -gt 0 ] || { say "pack: nothing in $OUT"; return 0; }
  tar -czf "$OUT/$STUDY-collect.tar.gz" -C "$OUT" "${files[@]}" &&
    (cd "$OUT" && rm -f -- "${files[@]}") &&
    say "packed ${#files[@]} files into $OUT/$STUDY-collect.tar.gz"
}

while [ $# -gt 0 ]; do
  case $1 in
    kit) kit || exit $? ;;
    prepare) prepare || { say "prepare failed"; exit 1; } ;;
    models) models || { say "models failed"; exit 1; } ;;
    failures) failures ;;
    start) start ;;
    explain) explain ;;
    budget) budget ;;
    sweep) sweep ;;
    agreement) agreement ;;
    check) check || { say "check failed"; exit 1; } ;;
    profile) profile || say "profile failed" ;;
    watch) watch "${2:-540}"; shift ;;
    collect) collect ;;
    pack) pack ;;
    *) echo "unknown verb '$1' (allowed: kit, prepare, models, failures, start, explain, budget, sweep, agreement, check, profile, watch SECONDS, collect, pack)" >&2; exit 2 ;;
  esac
  shift
done
