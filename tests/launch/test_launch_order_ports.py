"""Dependency order and port helpers."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

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
