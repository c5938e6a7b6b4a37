"""Fuzzed files and arguments name hosts; none of them may reach the network."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest

# Deployment._pick_ports looks pick_free_ports up in its own module: patch it there.
from autotune.deployment import _model as deployment

_REAL_GETADDRINFO = socket.getaddrinfo
_REAL_PICK = deployment.pick_free_ports


def _loopback_only(host: Any, *args: Any, **kwargs: Any) -> Any:
    """Resolve addresses and ``localhost`` only: a fuzzed host name never becomes a DNS
    query (the answer would be the same failure, just slower and off this machine)."""
    name = host.decode() if isinstance(host, bytes) else host
    if name is not None and name != "localhost":
        try:
            ipaddress.ip_address(str(name).split("%", 1)[0])
        except ValueError:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
    return _REAL_GETADDRINFO(host, *args, **kwargs)


def _pick_free_ports(host: str, count: int, **kwargs: Any) -> list[int]:
    """``socket.bind`` resolves names in C, past the patched ``getaddrinfo``."""
    _loopback_only(host, None)
    return _REAL_PICK(host, count, **kwargs)


@pytest.fixture(autouse=True, scope="module")
def _no_dns() -> Iterator[None]:
    socket.getaddrinfo = _loopback_only
    deployment.pick_free_ports = _pick_free_ports
    try:
        yield
    finally:
        socket.getaddrinfo = _REAL_GETADDRINFO
        deployment.pick_free_ports = _REAL_PICK
