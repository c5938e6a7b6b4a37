#!/usr/bin/env bash
# Issue 7 on the GPU machine: tune `transformers serve` on one H200 with autotune.
#
#   scripts/h200/fetch-wheels.sh            # here, once: the wheels the machine lacks -> .whl/
#   scripts/h200/run.sh prepare start watch 420   # there, first call (carry: [".whl"])
#   scripts/h200/run.sh watch 540                 # there, next calls, until the run ends
#   FROM_DB=benchmarks/h200/transformers-serve-h200.db EXPLAIN_ARGS="--repeats 2 --no-path" \
#     scripts/h200/run.sh prepare explain watch 420   # issue 18: explain the stored winner
#
# The device tool limits one command to 10 minutes and a session to 30 minutes of machine time,
# so `start` runs `autotune run` in its own process session (it outlives the call while the
# machine stays warm) and every `watch` ends by copying a consistent snapshot of the study
# database, the HTML report, `autotune best` and the logs to $OUT. If the machine is lost, the
# run resumes from the last snapshot: put it back at studies/NAME.db and call `start` again.
#
# Verbs, run in order:
#   prepare        install .whl/*.whl into /tmp/site, check the imports, build the model
#   start          start (or resume) the study in the background
#   explain        start (or resume) `autotune explain` of the study's winner in the background
#                  ($EXPLAIN_ARGS: its options; a stored study is put at studies/NAME.db first
#                  from $FROM_DB when that file is missing)
#   watch SECONDS  wait until the run ends or SECONDS pass, then collect
#   collect        snapshot the database, write the report and `best` into $OUT
set -uo pipefail
cd "$(dirname "$0")/../.."

STUDY=${STUDY:-transformers-serve-h200}
TRIALS=${TRIALS:-20}
SITE=${SITE:-/tmp/site}
MODEL=${MODEL:-/tmp/autotune-model}
OUT=${OUT:-/tmp/autotune-out}
PY=${PY:-python3}
LOG=studies/logs/$STUDY-run.log
PIDFILE=studies/logs/$STUDY-run.pid
export PYTHONPATH=$SITE:$PWD
export PYTHONUNBUFFERED=1
mkdir -p studies/logs "$OUT"

say() { printf '[%s] %s\n' "$(date -u +%T)" "$*"; }

prepare() {
  local t0=$SECONDS
  if [ ! -f "$SITE/.installed" ]; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
      say "no wheels in .whl/: run scripts/h200/fetch-wheels.sh on the machine with network, and carry .whl"
      return 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl || return 1
    touch "$SITE/.installed"
  fi
  "$PY" - <<'EOF' || return 1
import sys
import optuna, sqlalchemy, pydantic, plotly, fastapi, uvicorn, openai, torch, transformers
from transformers.utils.import_utils import is_serve_available
assert is_serve_available(), "transformers serve still misses a dependency"
import autotune.cli  # noqa: F401
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
      f"{transformers.__version__}, optuna {optuna.__version__}, pydantic {pydantic.__version__}, "
      f"fastapi {fastapi.__version__}, GPU {torch.cuda.get_device_name(0)}")
EOF
  "$PY" scripts/build_model.py --preset h200-2.8b --out "$MODEL" || return 1
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  say "prepared in $((SECONDS - t0)) s"
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

background() {
  if running; then say "already running (pid $(cat "$PIDFILE"))"; return 0; fi
  say "autotune $*"
  setsid nohup "$PY" -m autotune "$@" >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
}

start() { background run --study "$STUDY" --trials "$TRIALS"; }

explain() {
  if [ ! -f "studies/$STUDY.db" ] && [ -n "${FROM_DB:-}" ]; then
    cp "$FROM_DB" "studies/$STUDY.db" && say "study copied from $FROM_DB"
  fi
  # shellcheck disable=SC2086
  background explain --study "$STUDY" ${EXPLAIN_ARGS:-}
}

watch() {
  local end=$((SECONDS + ${1:-540}))
  while running && [ $SECONDS -lt $end ]; do sleep 5; done
  if running; then say "still running after the watch"; else say "the run has ended"; fi
  tail -n 60 "$LOG"
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
  "$PY" -m autotune best --study "$STUDY" >"$OUT/best.txt" 2>&1
  "$PY" -m autotune status --study "$STUDY" >"$OUT/status.txt" 2>&1
  "$PY" -m autotune explain --study "$STUDY" --show >"$OUT/explain.txt" 2>&1 || true
  "$PY" -m autotune best --study "$STUDY" --minimal >"$OUT/best-minimal.txt" 2>&1 || true
  cp "$LOG" "$OUT/run.log"
  # The server's log of the last trial (the run directory keeps one per service).
  find studies/runs -name '*.log' -newer "$PIDFILE" -print0 2>/dev/null |
    xargs -0 -r tail -n 300 >"$OUT/serve-tail.log" 2>/dev/null
  ls -la "$OUT"
}

while [ $# -gt 0 ]; do
  case $1 in
    prepare) prepare || { say "prepare failed"; exit 1; } ;;
    start) start ;;
    explain) explain ;;
    watch) watch "${2:-540}"; shift ;;
    collect) collect ;;
    *) echo "unknown verb '$1' (allowed: prepare, start, explain, watch SECONDS, collect)" >&2; exit 2 ;;
  esac
  shift
done
