"""Dependency order and port helpers."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from autotune import ports
from autotune.errors import ConfigError
from autotune.launch import LocalLauncher
from autotune.launch.order import DependencyError, dependency_order
from autotune.launch.ports import is_port_free, pick_free_ports, wait_port_free
from autotune.specs import ServiceSpec


def test_dependency_order_workers_first_and_stable() -> None:
    deps = {"router": ["prefill", "decode"], "prefill": [], "decode": []}
    assert dependency_order(deps) == ["prefill", "decode", "router"]
    assert dependency_order({"b": [], "a": []}) == ["b", "a"]


def test_dependency_errors() -> None:
    with pytest.raises(DependencyError) as cyc:
        dependency_order({"a": ["b"], "b": ["c"], "c": ["a"]})
    assert cyc.value.cycle == ["a", "b", "c", "a"]
    with pytest.raises(DependencyError) as unk:
        dependency_order({"a": ["zz"]})
    assert unk.value.unknown == "zz"


def test_apply_rejects_unknown_dependency(tmp_path: Path) -> None:
    spec = ServiceSpec(
        name="r",
        argv=("true",),
        port=1,
        health_url="http://x",
        log_file=str(tmp_path / "r.log"),
        depends_on=("nope",),
    )
    with LocalLauncher(tmp_path) as lau, pytest.raises(ConfigError) as info:
        lau.apply({"r": spec})
    assert info.value.field == "services.r.depends_on" and info.value.allowed == ["r"]


def test_port_helpers() -> None:
    ports = pick_free_ports("127.0.0.1", 3)
    assert len(set(ports)) == 3 and all(is_port_free("127.0.0.1", p) for p in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not is_port_free("127.0.0.1", port)
        assert not wait_port_free("127.0.0.1", port, timeout_s=0.1)
        assert port not in pick_free_ports("127.0.0.1", 5, exclude={port})
    assert wait_port_free("127.0.0.1", port, timeout_s=1.0)


def test_picked_ports_lie_below_the_ephemeral_range() -> None:
    """A port from the ephemeral range could become some connection's source port between the
    pick and the server's start; the picks stay below it."""
    start = ports.ephemeral_start()
    if start - ports.LOWEST_PICKED < 1_000:
        pytest.skip(f"this machine's ephemeral range starts at {start}: no band below it")
    picked = pick_free_ports("127.0.0.1", 40)
    assert len(set(picked)) == 40
    assert all(ports.LOWEST_PICKED <= p < start for p in picked), picked
    again = [ports.pick_free_port() for _ in range(20)]
    assert not set(again) & set(picked), "a port this process handed out came back"


def test_reserved_ports_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "range").write_text("21000\t60999\n")
    (tmp_path / "reserved").write_text("80,20000-20499,20600\n")
    monkeypatch.setattr(ports, "_PROC_RANGE", tmp_path / "range")
    monkeypatch.setattr(ports, "_PROC_RESERVED", tmp_path / "reserved")
    assert ports.ephemeral_start() == 21_000
    reserved = ports.reserved_ports()
    assert {80, 20000, 20499, 20600} <= reserved and 20500 not in reserved
    assert len(reserved) == 502
    picked = pick_free_ports("127.0.0.1", 20)
    assert not set(picked) & reserved, picked


def test_a_narrow_band_falls_back_to_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = ports.ephemeral_start()
    (tmp_path / "range").write_text("20500 60999\n")  # an administrator widened the range
    monkeypatch.setattr(ports, "_PROC_RANGE", tmp_path / "range")
    picked = pick_free_ports("127.0.0.1", 3)
    assert len(set(picked)) == 3 and all(p >= real_start for p in picked), picked


def test_an_address_of_another_machine_is_an_error() -> None:
    with pytest.raises(OSError) as info:
        pick_free_ports("192.0.2.1", 1)  # TEST-NET-1: never an address of this machine
    assert info.value.errno == errno.EADDRNOTAVAIL
