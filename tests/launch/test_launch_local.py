"""LocalLauncher against real processes on 127.0.0.1 (tests/launch/fixtures/service.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from autotune.errors import LaunchError
from autotune.launch import BEFORE_STAGES, FailureClass, LocalLauncher, ServiceStartup

if TYPE_CHECKING:
    from conftest import SpecFactory


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_not_running(pid: int, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_start_order_is_health_gated(launcher: LocalLauncher, make_spec: SpecFactory) -> None:
    specs = {
        "prefill": make_spec("prefill", "--ready-after", "0.6"),
        "decode": make_spec("decode", "--ready-after", "0.3"),
        "router": make_spec("router", depends_on=("prefill", "decode")),
    }
    events: list[tuple[str, str]] = []
    result = launcher.apply(specs, on_event=lambda s, e: events.append((s, e)))

    assert result.restarted == ["prefill", "decode", "router"]
    assert result.kept == [] and result.stopped == []
    assert result.seconds["prefill"] >= 0.5
    kv = {n: make_spec.read_kv(s.log_file)[-1] for n, s in specs.items()}
    workers_ready = max(float(kv["prefill"]["ready_at"]), float(kv["decode"]["ready_at"]))
    assert float(kv["router"]["start"]) >= workers_ready
    # Independent workers load concurrently, not one after the other.
    assert events.index(("decode", "starting")) < events.index(("prefill", "ready"))
    assert events.index(("router", "starting")) > events.index(("prefill", "ready"))
    assert events.index(("router", "starting")) > events.index(("decode", "ready"))
    assert result.info["prefill"]["pid"] == launcher.pids()["prefill"]
    assert "router" in result.info  # info_url given


def test_only_changed_services_restart(launcher: LocalLauncher, make_spec: SpecFactory) -> None:
    specs = {
        "prefill": make_spec("prefill"),
        "decode": make_spec("decode"),
        "router": make_spec("router", depends_on=("prefill", "decode")),
    }
    launcher.apply(specs)
    before = launcher.pids()

    same = launcher.apply(specs)
    assert same.restarted == [] and same.kept == ["prefill", "decode", "router"]
    assert launcher.pids() == before

    changed = dict(specs, decode=make_spec("decode", "--log", "new-setting"))
    result = launcher.apply(changed)
    after = launcher.pids()
    assert result.restarted == ["decode"]
    assert result.kept == ["prefill", "router"]  # the router depending on decode keeps running
    assert after["prefill"] == before["prefill"] and after["router"] == before["router"]
    assert after["decode"] != before["decode"]
    assert wait_not_running(before["decode"], 0.5)

    removed = launcher.apply({"prefill": specs["prefill"], "decode": changed["decode"]})
    assert removed.stopped == ["router"] and removed.restarted == []
    assert wait_not_running(after["router"], 0.5)
    assert "router" not in launcher.pids()


def test_dead_service_is_restarted(launcher: LocalLauncher, make_spec: SpecFactory) -> None:
    specs = {"prefill": make_spec("prefill")}
    launcher.apply(specs)
    pid = launcher.pids()["prefill"]
    os.killpg(pid, signal.SIGKILL)
    time.sleep(0.1)
    result = launcher.apply(specs)
    assert result.restarted == ["prefill"]
    assert launcher.pids()["prefill"] != pid


@pytest.mark.parametrize(
    ("line", "failure"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "unhandled cuda error",
            "nccl_error",
        ),
        ("OSError: [Errno 98] Address already in use", "port_in_use"),
        (
            "OSError: /models/DeepSeek-V4-Flash does not appear to have a file named config.json",
            "model_path_missing",
        ),
        ("launch_server.py: error: unrecognized arguments: --bogus", "config_rejected"),
        ("nothing recognizable here", "exited"),
    ],
)
def test_exit_before_ready_fails_fast(
    launcher: LocalLauncher, make_spec: SpecFactory, line: str, failure: str
) -> None:
    spec = make_spec(
        "prefill",
        "--ready-after",
        "60",
        "--log",
        line,
        "--exit-code",
        "3",
        "--exit-after",
        "0.4",
        timeout_s=30,
    )
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launcher.apply({"prefill": spec})
    t_fail = time.time()
    assert time.monotonic() - t0 < 2.0
    exited_at = float(make_spec.read_kv(spec.log_file)[-1]["start"]) + 0.4
    assert t_fail - exited_at < 0.5  # noticed promptly, not at the readiness timeout
    err = info.value
    assert err.service == "prefill" and err.failure == failure
    # Fatal classes (OOM, NCCL) are caught from the log even before the process exits.
    assert "exited with code 3" in err.reason or "fatal error while starting" in err.reason
    if failure != "exited":
        assert line in err.reason
    assert line in err.log_tail
    assert launcher.pids() == {}


def test_a_start_failure_names_the_stage_its_line_does_not(
    launcher: LocalLauncher, make_spec: SpecFactory
) -> None:
    """A plain CUDA OOM reads the same at every stage of a start; the reason adds where it
    came (SGLang's start-up lines, as the simulated server prints them), the failure class
    stays ``cuda_oom``."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    spec = make_spec(
        "decode",
        "--ready-after",
        "60",
        *("--log", "Load weight begin. avail mem=79.40 GB"),
        *("--log", "KV Cache is allocated. #tokens: 81920, K size: 2.50 GB"),
        *("--log", "Capture cuda graph begin. This can take up to several minutes."),
        *("--log", oom),
        "--exit-code",
        "1",
        "--exit-after",
        "0.3",
        timeout_s=30,
    )
    with pytest.raises(LaunchError) as info:
        launcher.apply({"decode": spec})
    err = info.value
    assert err.failure == "cuda_oom"
    assert err.reason.endswith(f"{oom} (while capturing CUDA graphs)"), err.reason
    # the failed start's stages are kept for the trial, each once, ending at the failure
    assert err.startup is not None
    failed = ServiceStartup.model_validate(err.startup)
    assert [m.stage for m in failed.stages] == [
        "loading the weights",
        "starting up after the KV cache was allocated",
        "capturing CUDA graphs",
    ]
    assert failed.ready_s is None and failed.failed_s is not None  # the OOM line, not the exit
    assert failed.failed_s >= failed.stages[-1].at_s
    assert failed.spans()[-1][0] == "capturing CUDA graphs"


# vLLM 0.26.0's own lines (tests/engines/data/vllm-0.26.0/), printed at these seconds
VLLM_START = (
    (0.4, "(EngineCore pid=4440) INFO [model_runner.py:284] Loading model from scratch..."),
    (1.0, "(EngineCore pid=4440) INFO [backends.py:1155] Dynamo bytecode transform time: 7.68 s"),
    (1.6, "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##| 67/67"),
    (1.7, "Capturing CUDA graphs (decode, FULL): 100%|##| 35/35"),
)


def test_a_start_records_when_each_stage_began(
    launcher: LocalLauncher, make_spec: SpecFactory
) -> None:
    """The launcher notes when it read each start-up stage line; the spans add up to the
    start: before the first line, each stage until the next, the last until healthy."""
    timed = [arg for after, line in VLLM_START for arg in ("--log-after", str(after), line)]
    spec = make_spec("server", "--ready-after", "2.2", *timed, timeout_s=30)
    result = launcher.apply({"server": spec})

    startup = result.startup["server"]
    labels = [m.stage for m in startup.stages]
    # the second capture line repeats the stage: entered once
    assert labels == [
        "loading the model",
        "compiling the model (torch.compile)",
        "capturing CUDA graphs",
    ]
    # never read before it was printed (the clock starts before the process does)
    for mark, (after, _) in zip(startup.stages, VLLM_START, strict=False):
        assert mark.at_s >= after - 0.05, (mark, after)
    assert [m.at_s for m in startup.stages] == sorted(m.at_s for m in startup.stages)
    assert startup.ready_s is not None and startup.ready_s >= 2.15
    assert startup.stages[-1].at_s <= startup.ready_s
    spans = startup.spans()
    assert [name for name, _ in spans] == [BEFORE_STAGES, *labels]
    assert sum(sec for _, sec in spans) == pytest.approx(startup.ready_s, abs=1e-6)
    assert spans[0][1] >= 0.35 and spans[-1][1] >= 0.45  # 0.4 s of start, 0.6 s of capture

    # a kept service is not restarted: no start-up to report
    again = launcher.apply({"server": spec})
    assert again.kept == ["server"] and again.startup == {}


def test_failure_leaves_consistent_state(launcher: LocalLauncher, make_spec: SpecFactory) -> None:
    bad = make_spec(
        "prefill",
        "--log",
        "RuntimeError: CUDA error: an illegal memory access",
        "--exit-code",
        "1",
        "--exit-after",
        "0.2",
        "--ready-after",
        "60",
    )
    decode = make_spec("decode", "--ready-after", "0.8")
    router = make_spec("router", depends_on=("prefill", "decode"))
    with pytest.raises(LaunchError) as info:
        launcher.apply({"prefill": bad, "decode": decode, "router": router})
    assert info.value.failure == "cuda_error"
    tails = launcher.log_tails({"prefill": bad, "decode": decode})
    assert "--- prefill" in tails and "illegal memory access" in tails and "--- decode" in tails
    # decode was loading concurrently: still recorded, not started twice.
    decode_pid = launcher.pids()["decode"]
    assert set(launcher.pids()) == {"decode"}

    good = make_spec("prefill")
    result = launcher.apply({"prefill": good, "decode": decode, "router": router})
    assert result.restarted == ["prefill", "decode", "router"]
    assert launcher.pids()["decode"] == decode_pid
    assert len(make_spec.read_kv(decode.log_file)) == 1


def test_fatal_log_line_while_alive_fails_fast(
    launcher: LocalLauncher, make_spec: SpecFactory
) -> None:
    spec = make_spec(
        "decode",
        "--hang",
        "--fatal-after",
        "0.3",
        "--spawn-child",
        "--fatal-line",
        "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 ms",
        timeout_s=30,
    )
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launcher.apply({"decode": spec})
    assert time.monotonic() - t0 < 10.0  # at the line (0.3 s), far from the 30 s timeout
    assert info.value.failure == "nccl_error"
    assert "Watchdog caught collective operation timeout" in info.value.reason
    kv = make_spec.read_kv(spec.log_file)[-1]
    assert not running(int(kv["pid"])) and wait_not_running(int(kv["child"]))


def test_readiness_timeout(launcher: LocalLauncher, make_spec: SpecFactory) -> None:
    spec = make_spec("prefill", "--hang", timeout_s=0.8)
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launcher.apply({"prefill": spec})
    elapsed = time.monotonic() - t0
    assert 0.8 <= elapsed < 6.0  # the 0.8 s timeout, with room for a busy machine
    assert info.value.failure == FailureClass.readiness_timeout.value
    assert "503" in info.value.reason
    assert not running(int(make_spec.read_kv(spec.log_file)[-1]["pid"]))


def test_stop_kills_whole_process_group(launcher: LocalLauncher, make_spec: SpecFactory) -> None:
    spec = make_spec("prefill", "--spawn-child")
    launcher.apply({"prefill": spec})
    kv = make_spec.read_kv(spec.log_file)[-1]
    pid, child = int(kv["pid"]), int(kv["child"])
    assert int(kv["pgid"]) == pid  # own process group
    # ... in the tuner's session: a session apart is a scheduling group apart where the
    # kernel's autogroup is on, and a busy engine there starved the load generator
    assert os.getsid(pid) == os.getsid(0)
    assert running(child)
    launcher.stop_all()
    assert not running(pid)
    assert wait_not_running(child, 1.0)
    assert launcher.pids() == {}


def test_sigkill_after_grace(tmp_path: Path, make_spec: SpecFactory) -> None:
    spec = make_spec("stubborn", "--ignore-sigterm", "--spawn-child")
    with LocalLauncher(tmp_path, stop_grace_s=0.5, poll_interval_s=0.05) as lau:
        lau.apply({"stubborn": spec})
        kv = make_spec.read_kv(spec.log_file)[-1]
        t0 = time.monotonic()
        lau.stop_all()
        took = time.monotonic() - t0
    assert 0.5 <= took < 6.0  # the 0.5 s grace, then SIGKILL; room for a busy machine
    assert not running(int(kv["pid"])) and not running(int(kv["child"]))


def test_port_is_free_before_each_restart(launcher: LocalLauncher, make_spec: SpecFactory) -> None:
    for i in range(3):
        spec = make_spec("prefill", "--log", f"round-{i}")
        result = launcher.apply({"prefill": spec})
        assert result.restarted == ["prefill"]
    starts = make_spec.read_kv(spec.log_file)
    assert len(starts) == 3 and all("listening" in s for s in starts)
    launcher.stop_all()
    with socket.socket() as sock:  # released once stop_all returns
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", spec.port))


def test_foreign_socket_on_port_is_port_in_use(tmp_path: Path, make_spec: SpecFactory) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec = make_spec("prefill", port=port)
        with LocalLauncher(tmp_path, port_wait_s=0.3) as lau:
            t0 = time.monotonic()
            with pytest.raises(LaunchError) as info:
                lau.apply({"prefill": spec})
            assert time.monotonic() - t0 < 2.0
            assert info.value.failure == "port_in_use"
            assert f"127.0.0.1:{port}" in info.value.reason
            assert lau.pids() == {}
    assert not Path(spec.log_file).exists()  # nothing was started


def test_unset_env_removes_inherited_variable(
    launcher: LocalLauncher, make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NCCL_PROTO", "LL128")
    monkeypatch.setenv("AUTOTUNE_TEST_KEEP", "inherited")
    spec = make_spec(
        "decode",
        "--print-env",
        "NCCL_PROTO",
        "--print-env",
        "AUTOTUNE_TEST_KEEP",
        "--print-env",
        "NCCL_ALGO",
        env={"NCCL_ALGO": "Ring"},
        unset_env=("NCCL_PROTO",),
    )
    launcher.apply({"decode": spec})
    text = Path(spec.log_file).read_text()
    assert "env NCCL_PROTO=<unset>" in text
    assert "env AUTOTUNE_TEST_KEEP=inherited" in text
    assert "env NCCL_ALGO=Ring" in text
    assert "=== autotune: start decode" in text and "env -u NCCL_PROTO NCCL_ALGO=Ring" in text


def test_fresh_launcher_stops_leftovers(tmp_path: Path, make_spec: SpecFactory) -> None:
    spec = make_spec("prefill", "--spawn-child")
    crashed = LocalLauncher(tmp_path)
    crashed.apply({"prefill": spec})  # never closed: a session that died
    state = json.loads((tmp_path / "state.json").read_text())
    kv = make_spec.read_kv(spec.log_file)[-1]
    pid, child = int(kv["pid"]), int(kv["child"])
    assert state["services"]["prefill"]["pid"] == pid

    fresh = LocalLauncher(tmp_path, stop_grace_s=2.0)
    fresh.stop_all()
    assert wait_not_running(pid, 1.0) and wait_not_running(child, 1.0)
    assert not (tmp_path / "state.json").exists()
    crashed.close()  # reaps its zombie; nothing left to stop


def test_leftovers_are_stopped_before_first_start(tmp_path: Path, make_spec: SpecFactory) -> None:
    spec = make_spec("prefill")
    crashed = LocalLauncher(tmp_path)
    crashed.apply({"prefill": spec})
    old = crashed.pids()["prefill"]
    events: list[tuple[str, str]] = []
    with LocalLauncher(tmp_path) as fresh:
        fresh.apply({"prefill": spec}, on_event=lambda s, e: events.append((s, e)))
        assert fresh.pids()["prefill"] != old  # same port: the leftover had to go first
        assert ("prefill", "stopping leftover") in events
    assert not running(old)
    crashed.close()


def test_keyboard_interrupt_stops_what_was_starting(
    launcher: LocalLauncher, make_spec: SpecFactory
) -> None:
    spec = make_spec("prefill", "--ready-after", "30")
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launcher.apply({"prefill": spec})
    finally:
        timer.cancel()
    kv = make_spec.read_kv(spec.log_file)[-1]
    assert not running(int(kv["pid"]))
    assert launcher.pids() == {}
