#!/usr/bin/env bash
# autotune on the offline H200 machine, one device call at a time (README, "Tuning vLLM on a
# GPU"; issue 7's transformers serve study used the same verbs).
#
# vLLM 0.26.0 (issue 28). Here, once: python3 scripts/h200/kit.py build vllm-0.26.0
# Then one device call per part, back to back (the machine stays warm 30 s between calls):
#   carry [".kit/vllm-0.26.0/kit.json", ".kit/vllm-0.26.0/part-01"]:  scripts/h200/run.sh kit
#   ... part-02, part-03 ...
#   carry [... "part-04"]:  scripts/h200/run.sh kit models failures start watch 420
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
#   watch SECONDS  wait until the run ends or SECONDS pass, then collect
#   collect        snapshot the database, write the report and `best` into $OUT
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
LOG=studies/logs/$STUDY-run.log
PIDFILE=studies/logs/$STUDY-run.pid
export PYTHONPATH=$SITE:$PWD
export PYTHONUNBUFFERED=1
# vLLM without flashinfer (not in the kit): its top-k/top-p sampler falls back to PyTorch.
export VLLM_USE_FLASHINFER_SAMPLER=0
# One torch.compile / CUDA-graph cache for every trial of the machine: vLLM keys its entries by
# a hash of the configuration, so a restart with a configuration seen before loads instead of
# compiling (start-up 47-134 s cold, DOMAIN.md §8b).
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/var/tmp/autotune-vllm-cache}
mkdir -p studies/logs "$OUT"

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
  local t0=$SECONDS entry
  "$PY" -c 'import sys, torch, transformers; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, GPU {torch.cuda.get_device_name(0)}")' || return 1
  for entry in $MODELS; do
    "$PY" scripts/build_model.py --preset "${entry%%:*}" --out "${entry#*:}" || return 1
  done
  [ "$KIT" = "vllm-0.26.0" ] && { "$PY" scripts/h200/moe_configs.py || return 1; }
  nvidia-smi --query-gpu=name,memory.total,memory.used,power.limit,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -5
  say "models ready in $((SECONDS - t0)) s"
}

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
      # uvicorn listens once start-up is complete (no curl on the GPU image is assumed)
      if (exec 3<>"/dev/tcp/127.0.0.1/$3") 2>/dev/null; then
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

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

background() {
  if running; then say "already running (pid $(cat "$PIDFILE"))"; return 0; fi
  if [ ! -f "studies/$STUDY.db" ] && [ -n "${FROM_DB:-}" ]; then
    cp "$FROM_DB" "studies/$STUDY.db" && say "study copied from $FROM_DB"
  fi
  say "autotune $*"
  setsid nohup "$PY" -m autotune "$@" >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
}

start() { background run --study "$STUDY" --trials "$TRIALS"; }

explain() {
  # shellcheck disable=SC2086
  background explain --study "$STUDY" ${EXPLAIN_ARGS:-}
}

watch() {
  local end=$((SECONDS + ${1:-540}))
  while running && [ $SECONDS -lt $end ]; do sleep 5; done
  if running; then say "still running after the watch"; else say "the run has ended"; fi
  tail -n 40 "$LOG"
  collect
}

collect() {
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
  cp "$LOG" "$OUT/run.log"
  # The server's log of the newest trials (the run directory keeps one per service).
  find studies/runs -name '*.log' -newer "$PIDFILE" -print0 2>/dev/null |
    xargs -0 -r ls -t | head -3 | xargs -r tail -n 150 >"$OUT/serve-tail.log" 2>/dev/null
  ls -la "$OUT"
}

while [ $# -gt 0 ]; do
  case $1 in
    kit) kit || exit $? ;;
    prepare) prepare || { say "prepare failed"; exit 1; } ;;
    models) models || { say "models failed"; exit 1; } ;;
    failures) failures ;;
    start) start ;;
    explain) explain ;;
    watch) watch "${2:-540}"; shift ;;
    collect) collect ;;
    *) echo "unknown verb '$1' (allowed: kit, prepare, models, failures, start, explain, watch SECONDS, collect)" >&2; exit 2 ;;
  esac
  shift
done
