"""Faults of a server that stays alive, end to end through the real tuning loop.

transformers serve keeps answering after its continuous-batching worker died of a CUDA OOM
(every request then fails), and is silent while torch.compile works on its first request.
Neither process exits, so the cause is in its log: the runner must find it there
(``explain_fault``) and record it as the trial's failure class.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from autotune.results import feasible
from autotune.study.definition import load_study_definition
from autotune.study.runner import Tuner
from autotune.trial import FAULT_SCAN_LINES

OOM_LINE = (
    "ERROR:transformers.generation.continuous_batching.continuous_api:Error in generation loop: "
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 139.72 GiB of which 1.06 GiB is free."
)
TRACING_LINE = "torch._dynamo.symbolic_convert: [INFO] Step 1: torchdynamo start tracing forward"
ACCESS_LINE = (
    'INFO:     127.0.0.1:53290 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error'
)
FILLER = 600
"""Access lines printed after the OOM: more than 16 KiB of log, fewer than FAULT_SCAN_LINES."""

# A stand-in for `transformers serve` that stays alive whatever happens to its requests.
SERVER = textwrap.dedent(
    f"""
    import argparse, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    OOM_LINE = {OOM_LINE!r}
    TRACING_LINE = {TRACING_LINE!r}
    ACCESS_LINE = {ACCESS_LINE!r}

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", required=True)
    args = parser.parse_args()
    first = threading.Lock()
    seen = []

    def say(*lines):
        sys.stderr.write("".join(line + "\\n" for line in lines))
        sys.stderr.flush()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, status, body):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(200 if self.path == "/health" else 404, b'{{"status": "ok"}}')

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with first:
                is_first = not seen
                seen.append(1)
            mode = args.mode
            if mode == "oom":
                if is_first:  # the worker thread dies; the HTTP server goes on
                    say("Traceback (most recent call last):", OOM_LINE)
                    say(*[ACCESS_LINE] * {FILLER})
                self._send(500, b'{{"error": {{"message": "generation worker is dead"}}}}')
                return
            if mode == "oom_late":  # the errors are answered before the cause is logged
                self._send(500, b'{{"error": {{"message": "generation worker is dead"}}}}')
                if is_first:
                    time.sleep(0.5)
                    say("Traceback (most recent call last):", OOM_LINE)
                return
            if mode == "compile_500":
                if is_first:
                    say(TRACING_LINE)
                self._send(500, b'{{"error": {{"message": "boom"}}}}')
                return
            if mode == "compile_hang" and is_first:
                say(TRACING_LINE)
            time.sleep(3600)  # compiling (or stuck): never answers

    say("INFO:     Application startup complete.")
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever(0.05)
    """
)

MAX_DURATION_S = 2.0
TRIAL_TIMEOUT_S = 30.0


def _study(tmp_path: Path) -> Path:
    (tmp_path / "live_server.py").write_text(SERVER)
    space = {
        "name": "live",
        "services": ["server"],
        "engine": {"name": "generic"},
        "parameters": {
            "mode": {
                "type": "categorical",
                "choices": ["oom", "oom_late", "compile_hang", "hang", "compile_500"],
                "target": {"flag": "--mode"},
            }
        },
        "baseline": {"mode": "oom"},
    }
    deployment = {
        "name": "live",
        "endpoint": "http://${server.host}:${server.port}",
        "model": "live-model",  # no /v1/models lookup
        "run_dir": "studies/runs/${deployment}",
        "services": {
            "server": {
                "command": [
                    "${python}",
                    str(tmp_path / "live_server.py"),
                    "--port",
                    "${port}",
                ],  # fmt: skip
                "host": "127.0.0.1",
                "port": "auto",
                "health": {"url": "http://${host}:${port}/health", "timeout_s": 20},
                "log_file": "${run_dir}/server.log",
            }
        },
    }
    study = {
        "name": "live",
        "space": "live-space.yaml",
        "deployment": "live-deployment.yaml",
        "objective": "throughput",
        "sampler": "random",
        "trial_timeout_s": TRIAL_TIMEOUT_S,
        "load": {
            "concurrency": 2,
            "input_len": 8,
            "output_len": 4,
            "warmup_requests": 2,
            "requests": 4,
            "max_duration_s": MAX_DURATION_S,
            # Longer than max_duration_s: the warm-up cap, not a request timeout, ends it.
            "request_timeout_s": 10,
        },
        "correctness": {"enabled": False},
        "remeasure": {"top_k": 0},
    }
    for name, data in (("space", space), ("deployment", deployment), ("study", study)):
        (tmp_path / f"live-{name}.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "live-study.yaml"


def _run_one(tmp_path: Path, mode: str) -> dict[str, object]:
    tuner = Tuner(
        definition=load_study_definition(_study(tmp_path)),
        study_name="live",
        storage_url=f"sqlite:///{tmp_path / 'live.db'}",
    )
    tuner.study.enqueue_trial({"mode": mode})  # before run(): no baseline is added
    summary = tuner.run(n_trials=1)
    assert summary.trials_total == 1 and not summary.left_running
    (trial,) = tuner.study.get_trials()
    assert trial.state == TrialState.COMPLETE
    assert trial.user_attrs["config"] == {"mode": mode}
    assert not feasible(trial) and trial.constraints["feasible"] == 1.0
    # Every service was stopped after the fault: nothing left running.
    assert not list((tmp_path / "studies" / "runs").rglob("state.json"))
    return dict(trial.user_attrs)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_oom_of_a_live_server_is_found_in_its_log(tmp_path: Path) -> None:
    assert FILLER < FAULT_SCAN_LINES and FILLER * len(ACCESS_LINE) > 16384
    t0 = time.monotonic()
    attrs = _run_one(tmp_path, "oom")
    assert attrs["failure"] == "cuda_oom", attrs["reason"]
    reason = str(attrs["reason"])
    assert "HTTP 500" in reason  # what the load generator saw comes first
    assert f"; the log says: {OOM_LINE}" in reason
    (log_file,) = (tmp_path / "studies" / "runs").rglob("server.log")
    assert OOM_LINE in log_file.read_text()
    assert time.monotonic() - t0 < 15  # failed on the first error, not at a timeout


def test_a_cause_logged_after_the_failed_warm_up_is_still_found(tmp_path: Path) -> None:
    # On a busy machine a second warm-up request can get its error before the thread that
    # hit the OOM has logged it; the log is asked again before the trial is classified.
    attrs = _run_one(tmp_path, "oom_late")
    assert attrs["failure"] == "cuda_oom", attrs["reason"]
    assert "warm-up request" in str(attrs["reason"])
    assert f"; the log says: {OOM_LINE}" in str(attrs["reason"])


def test_silent_server_with_torch_compile_in_its_log_is_compile_timeout(tmp_path: Path) -> None:
    attrs = _run_one(tmp_path, "compile_hang")
    assert attrs["failure"] == "compile_timeout", attrs["reason"]
    reason = str(attrs["reason"])
    assert "warm-up did not finish within max_duration_s=2" in reason
    assert f"; the log says: {TRACING_LINE}" in reason
    phases = attrs["phase_seconds"]
    assert isinstance(phases, dict) and phases["total"] < TRIAL_TIMEOUT_S


def test_silent_server_without_compile_lines_is_a_plain_timeout(tmp_path: Path) -> None:
    attrs = _run_one(tmp_path, "hang")
    assert attrs["failure"] in {"bench_failed", "trial_timeout"}, attrs["reason"]
    assert "warm-up did not finish" in str(attrs["reason"])
    assert "the log says" not in str(attrs["reason"])


def test_compile_lines_do_not_explain_errors_that_were_answered(tmp_path: Path) -> None:
    # The server answered (HTTP 500) rather than stalling: torch.compile is not the cause.
    attrs = _run_one(tmp_path, "compile_500")
    assert attrs["failure"] == "bench_failed", attrs["reason"]
    assert "the log says" not in str(attrs["reason"])
