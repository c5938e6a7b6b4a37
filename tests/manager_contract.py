"""The contract every service manager keeps behind the one launcher.

In the style of Optuna's ``optuna/testing/pytest_samplers.py``: the tests live here, in
:class:`ManagerContract`; each manager's test file subclasses it (``class
TestLocalManager(ManagerContract)``), provides the ``rig`` fixture (a :class:`Rig`: how a
launcher over that manager is built and where a spec is placed) and inherits every test.
The launcher is :class:`~autotune.launch.managed.ManagedLauncher` in all of them, so what
these tests pin (wording, timing, order) is the same for ``local``, ``process`` and
``systemd``.

Services are ``tests/launch/fixtures/service.py`` on free loopback ports; ``/server_info``
answers the server's pid, which is how the tests follow processes whatever runs them.
"""

from __future__ import annotations

import socket
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from autotune.errors import LaunchError
from autotune.launch.base import Launcher
from autotune.ports import pick_free_port as free_port
from autotune.specs import ServiceSpec

PY = sys.executable
SERVICE = Path(__file__).resolve().parent / "launch" / "fixtures" / "service.py"
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
NCCL_LINE = (
    "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 ms"
)


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (every rig runs on this machine)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def wait_until(pred: Callable[[], object], *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def healthy(spec: ServiceSpec) -> bool:
    try:
        return httpx.get(spec.health_url, timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def server_pid(spec: ServiceSpec) -> int:
    assert spec.info_url is not None
    return int(httpx.get(spec.info_url, timeout=2.0, trust_env=False).json()["pid"])


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Rig(ABC):
    """How one manager is driven: launchers over it and specs placed on it.

    Every :meth:`launcher` is a new session (new manager objects) on the same run
    directories, as the next ``autotune run`` after a crash would be.
    """

    fail_fast_s: float
    """How soon a service that died before it was ready must be reported (the manager's
    check interval plus a busy machine's margin)."""
    scratch_is_the_managers: bool = True
    """The manager picks the scratch directory's path (short enough for a Unix socket in
    it); under systemd it is systemd's ``%t`` (``/run``), the fake's a test directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.ports: dict[str, int] = {}
        self._launchers: list[Launcher] = []

    @abstractmethod
    def _new_launcher(self) -> Launcher:
        """A launcher over a fresh manager on the rig's run directory."""

    def placement(self, name: str) -> dict[str, object]:
        """The spec fields that put service ``name`` on this manager."""
        return {}

    def launcher(self) -> Launcher:
        lau = self._new_launcher()
        self._launchers.append(lau)
        return lau

    def spec(
        self,
        name: str,
        *args: str,
        depends_on: Sequence[str] = (),
        timeout_s: float = 20.0,
        scratch_env: Sequence[str] = (),
    ) -> ServiceSpec:
        port = self.ports.setdefault(name, free_port())
        fields: dict[str, object] = {
            "name": name,
            "argv": (PY, str(SERVICE), "--port", str(port), *args),
            "port": port,
            "health_url": f"http://127.0.0.1:{port}/health",
            "info_url": f"http://127.0.0.1:{port}/server_info",
            "ready_timeout_s": timeout_s,
            "log_file": str(self.tmp_path / f"{name}.log"),
            "depends_on": tuple(depends_on),
            "scratch_env": tuple(scratch_env),
            **self.placement(name),
        }
        return ServiceSpec.model_validate(fields)

    def cleanup(self) -> None:
        """Stop what the tests left (a launcher abandoned on purpose included)."""
        for lau in self._launchers:
            lau.close()
        closer = self._new_launcher()
        closer.restore({name: self.spec(name) for name in self.ports})
        closer.close()


class ManagerContract:
    """The tests; a subclass provides the ``rig`` fixture."""

    @pytest.fixture
    def rig(self, tmp_path: Path) -> Iterator[Rig]:
        raise NotImplementedError("a manager's test class provides the rig")

    def test_start_then_healthy_with_server_info(self, rig: Rig) -> None:
        lau = rig.launcher()
        spec = rig.spec("svc", "--ready-after", "0.3")
        result = lau.apply({"svc": spec})
        assert result.restarted == ["svc"] and result.kept == []
        assert result.seconds["svc"] >= 0.3
        assert healthy(spec)
        pid = result.info["svc"]["pid"]  # /server_info, read once it was healthy
        assert pid == server_pid(spec) and running(pid)
        assert lau.running() == ["svc"]
        lau.close()
        assert not running(pid) and not healthy(spec)

    def test_death_before_ready_is_classified_from_the_log_quickly(self, rig: Rig) -> None:
        lau = rig.launcher()
        spec = rig.spec(
            "svc",
            *("--ready-after", "60", "--log", OOM_LINE),
            *("--exit-code", "1", "--exit-after", "0.3"),
            timeout_s=30,
        )
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as info:
            lau.apply({"svc": spec})
        took = time.monotonic() - t0
        assert took < rig.fail_fast_s, took  # not at the 30 s readiness timeout
        err = info.value
        assert err.service == "svc" and err.failure == "cuda_oom"
        assert err.reason.startswith(("exited with code 1: ", "exited: ", "fatal error while"))
        assert OOM_LINE in err.reason and OOM_LINE in err.log_tail
        assert lau.running() == []

    def test_fatal_line_while_alive_fails_fast_and_stops_it(self, rig: Rig) -> None:
        lau = rig.launcher()
        spec = rig.spec(
            "svc", "--hang", "--fatal-after", "0.3", "--fatal-line", NCCL_LINE, timeout_s=30
        )
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as info:
            lau.apply({"svc": spec})
        took = time.monotonic() - t0
        assert took < rig.fail_fast_s, took
        assert info.value.failure == "nccl_error"
        assert info.value.reason == f"fatal error while starting (stopped): {NCCL_LINE}"
        assert wait_until(lambda: port_free(spec.port), timeout_s=5)
        assert lau.running() == []

    def test_readiness_timeout_message(self, rig: Rig) -> None:
        lau = rig.launcher()
        spec = rig.spec("svc", "--hang", timeout_s=1.0)
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as info:
            lau.apply({"svc": spec})
        took = time.monotonic() - t0
        assert 1.0 <= took < 1.0 + rig.fail_fast_s, took
        assert info.value.failure == "readiness_timeout"
        assert info.value.reason == f"not healthy after 1 s ({spec.health_url}: 503)"
        assert "listening=" in info.value.log_tail
        assert lau.running() == [] and wait_until(lambda: port_free(spec.port), timeout_s=5)

    def test_deadline_caps_the_start(self, rig: Rig) -> None:
        lau = rig.launcher()
        spec = rig.spec("svc", "--ready-after", "30", timeout_s=60)
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as info:
            lau.apply({"svc": spec}, deadline=time.monotonic() + 1.0)
        assert time.monotonic() - t0 < 1.0 + rig.fail_fast_s
        assert info.value.failure == "trial_timeout"
        assert lau.running() == []

    def test_stop_frees_the_port(self, rig: Rig) -> None:
        lau = rig.launcher()
        spec = rig.spec("svc", "--spawn-child")
        lau.apply({"svc": spec})
        pid = server_pid(spec)
        lau.stop_all()
        assert port_free(spec.port)  # at once: stop_all returns when the group is gone
        assert not running(pid) and lau.running() == []

    def test_restart_only_what_changed(self, rig: Rig) -> None:
        lau = rig.launcher()
        specs = {
            "prefill": rig.spec("prefill"),
            "decode": rig.spec("decode"),
            "router": rig.spec("router", depends_on=("prefill", "decode")),
        }
        first = lau.apply(specs)
        assert first.restarted == ["prefill", "decode", "router"]
        before = {n: server_pid(s) for n, s in specs.items()}

        same = lau.apply(specs)
        assert same.restarted == [] and same.kept == ["prefill", "decode", "router"]

        changed = dict(specs, decode=rig.spec("decode", "--log", "new-setting"))
        result = lau.apply(changed)
        assert result.restarted == ["decode"] and result.kept == ["prefill", "router"]
        after = {n: server_pid(s) for n, s in changed.items()}
        assert after["prefill"] == before["prefill"] and after["router"] == before["router"]
        assert after["decode"] != before["decode"] and not running(before["decode"])

    def test_stops_go_in_reverse_dependency_order(self, rig: Rig) -> None:
        lau = rig.launcher()
        specs = {
            "prefill": rig.spec("prefill"),
            "decode": rig.spec("decode"),
            "router": rig.spec("router", depends_on=("prefill", "decode")),
        }
        lau.apply(specs)
        events: list[tuple[str, str]] = []
        result = lau.apply({}, on_event=lambda s, e: events.append((s, e)))
        assert sorted(result.stopped) == ["decode", "prefill", "router"]
        for worker in ("prefill", "decode"):
            assert events.index(("router", "stopped")) < events.index((worker, "stopping"))
        assert lau.running() == []

    def test_stop_all_is_idempotent(self, rig: Rig) -> None:
        lau = rig.launcher()
        spec = rig.spec("svc")
        lau.apply({"svc": spec})
        pid = server_pid(spec)
        lau.stop_all()
        lau.stop_all()
        rig.launcher().stop_all()  # a fresh session with nothing of its own
        assert not running(pid) and lau.running() == []
        again = lau.apply({"svc": spec})  # and the launcher still works
        assert again.restarted == ["svc"] and healthy(spec)

    def test_leftover_of_a_killed_tuner_is_cleaned_up_on_the_next_start(self, rig: Rig) -> None:
        spec = rig.spec("svc", "--spawn-child")
        killed = rig.launcher()
        killed.apply({"svc": spec})
        old = server_pid(spec)
        # The tuner dies here: nothing stops its services; only the records it wrote on
        # the host (state file, pidfile, unit state) are left for the next session.
        fresh = rig.launcher()
        result = fresh.apply({"svc": spec})
        assert result.restarted == ["svc"]  # same port: the leftover had to go first
        new = server_pid(spec)
        assert new != old and wait_until(lambda: not running(old), timeout_s=5)
        fresh.close()
        assert not running(new) and wait_until(lambda: port_free(spec.port), timeout_s=5)

    def test_a_scratch_directory_is_the_services_own_and_goes_with_it(self, rig: Rig) -> None:
        """``scratch_env`` (vLLM's sockets): a directory of the service's own, empty at each
        start, owner-only, removed once the service has stopped, even after a crash of the
        tuner; a spec without it gets no variable."""
        var = "AUTOTUNE_TEST_SCRATCH"
        spec = rig.spec("svc", "--leave-file-in", var, scratch_env=(var,))
        killed = rig.launcher()
        first = killed.apply({"svc": spec}).info["svc"]
        scratch = Path(first["scratch"])
        assert scratch.is_absolute()
        if rig.scratch_is_the_managers:  # room for vLLM's socket names (a uuid4) in 107 bytes
            assert len(f"{scratch}/{'x' * 36}") <= 107
        assert scratch.is_dir() and scratch.stat().st_mode & 0o777 == 0o700
        assert [p.name for p in scratch.iterdir()] == [f"left-by-{first['pid']}"]
        # The tuner dies; the next session's start stops the leftover and starts afresh.
        fresh = rig.launcher()
        second = fresh.apply({"svc": spec}).info["svc"]
        assert second["pid"] != first["pid"]
        again = Path(second["scratch"])
        assert [p.name for p in again.iterdir()] == [f"left-by-{second['pid']}"]
        fresh.stop_all()
        assert not again.exists() and not scratch.exists()
        plain = rig.spec("plain", "--leave-file-in", var)
        assert fresh.apply({"plain": plain}).info["plain"]["scratch"] == ""
        fresh.close()
