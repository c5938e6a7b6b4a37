"""optuna-dashboard served on a real SQLite study, queried over its HTTP API on loopback."""

from __future__ import annotations

import inspect
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest_results import TrialSpec, make_study
from net_helpers import listeners, stop, wait_listening

from autotune.dashboard import serve_dashboard
from autotune.errors import ConfigError, StorageError
from autotune.ports import pick_free_port as free_port

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

SERVE = (
    "import sys; from autotune.dashboard import serve_dashboard; "
    "serve_dashboard(sys.argv[1], port=int(sys.argv[2]), artifact_dir=sys.argv[3])"
)


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """One dashboard process for the module (starting one takes seconds)."""
    tmp_path = tmp_path_factory.mktemp("dashboard")
    make_study(
        tmp_path,
        [
            TrialSpec(throughput=25.0, tpot_p99_ms=510.0, is_baseline=True),
            TrialSpec(throughput=800.0, tpot_p99_ms=30.0),
            TrialSpec(failure="cuda_oom"),
        ],
        multi=True,
        name="dash-study",
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, f"sqlite:///{tmp_path / 'study.db'}", str(port),
         str(tmp_path / "artifacts")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"dashboard exited early ({proc.returncode}): {out[-2000:]}")
            try:
                if httpx.get(f"{base}/api/meta", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("dashboard did not answer /api/meta within 30 s")
            time.sleep(0.1)
        yield base, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_api_lists_study_metrics_and_user_attrs(dashboard: tuple[str, int]) -> None:
    base, _ = dashboard
    meta = httpx.get(f"{base}/api/meta", timeout=10).json()
    assert meta["artifact_is_available"] is True
    studies = httpx.get(f"{base}/api/studies", timeout=10).json()["study_summaries"]
    (study,) = [s for s in studies if s["study_name"] == "dash-study"]
    assert study["directions"] == ["maximize", "minimize"]
    detail = httpx.get(f"{base}/api/studies/{study['study_id']}", timeout=10).json()
    assert detail["objective_names"] == ["output_throughput_tok_s", "tpot_p99_ms"]
    trials = detail["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2]
    attrs = {a["key"]: a["value"] for a in trials[0]["user_attrs"]}
    assert attrs["is_baseline"] == "True"
    assert json.loads(attrs["config"])["moe_runner_backend"] == "marlin"
    failed = {a["key"]: a["value"] for a in trials[2]["user_attrs"]}
    assert failed["failure"] == "cuda_oom"
    # The old list-valued "constraints" system attribute is what the dashboard shows.
    assert trials[0]["constraints"] == [0.0, -1.0]
    assert trials[2]["constraints"] == [1.0, 1.0]
    best = [t["number"] for t in detail["best_trials"]]
    assert 1 in best and 2 not in best


def test_listens_on_loopback_only(dashboard: tuple[str, int]) -> None:
    _, port = dashboard
    addrs = listeners(port)
    assert addrs, "no listening socket found in /proc/net/tcp"
    assert set(addrs) == {"0100007F"}  # 127.0.0.1 in /proc's little-endian hex
    # And no other local address accepts connections on that port.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent for UDP connect
            own = probe.getsockname()[0]
        except OSError:
            own = "127.0.0.1"
    if own != "127.0.0.1" and not own.startswith("127."):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            assert s.connect_ex((own, port)) != 0


def test_default_host_is_loopback() -> None:
    params = inspect.signature(serve_dashboard).parameters
    assert params["host"].default == "127.0.0.1"
    assert params["port"].default == 8080


def test_missing_database_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    with pytest.raises(StorageError, match="no such database file"):
        serve_dashboard(f"sqlite:///{missing}", port=free_port())
    assert not missing.exists()  # not silently created


def test_port_in_use_is_a_config_error(tmp_path: Path) -> None:
    make_study(tmp_path, [TrialSpec()])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
            serve_dashboard(f"sqlite:///{tmp_path / 'study.db'}", port=port)


def _cli_dashboard(db: Path, port: int, *host: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "dashboard", "--study", "cli-dash",
         "--storage", f"sqlite:///{db}", "--port", str(port), *host],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_cli_dashboard_binds_loopback_unless_told(tmp_path: Path) -> None:
    """``autotune dashboard`` for real: 127.0.0.1 by default; ``--host`` is honoured (shown
    with 127.0.0.2, a second loopback address, to stay off the network)."""
    make_study(tmp_path, [TrialSpec()], name="cli-dash")
    db = tmp_path / "study.db"
    port = free_port()
    proc = _cli_dashboard(db, port)
    try:
        assert set(wait_listening(proc, port, what="autotune dashboard")) == {"0100007F"}
    finally:
        stop(proc)
    port = free_port()
    proc = _cli_dashboard(db, port, "--host", "127.0.0.2")
    try:
        assert set(wait_listening(proc, port, what="autotune dashboard")) == {
            "0200007F"
        }  # control: the flag is used
        assert httpx.get(f"http://127.0.0.2:{port}/api/meta", timeout=10).status_code == 200
    finally:
        stop(proc)


def test_storage_password_is_not_in_the_error() -> None:
    url = "postgresql://tuner:pw-CANARY42@127.0.0.1:1/optuna"
    with pytest.raises(StorageError) as info:
        serve_dashboard(url, port=free_port())
    assert "pw-CANARY42" not in str(info.value)
    assert "127.0.0.1:1/optuna" in str(info.value)  # control: the URL is in the message
