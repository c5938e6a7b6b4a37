"""Local TCP port checks: is a port free, wait until it is, pick free ones.

A server that starts while its predecessor still holds the port dies with "Address already
in use" and the trial is wasted; worse, a health check could be answered by a foreign
process. The launcher therefore waits, bounded, until the port can be bound.
"""

from __future__ import annotations

import contextlib
import socket
import time


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def is_port_free(host: str, port: int) -> bool:
    """True when a server could bind ``host:port`` now.

    Binds with ``SO_REUSEADDR`` like the servers do (uvicorn, aiohttp, http.server), so
    connections in TIME_WAIT do not count as "in use"; a listening or bound socket does.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def wait_port_free(host: str, port: int, *, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll until ``host:port`` is free; False when it is still taken after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if is_port_free(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


_HANDED_OUT: set[tuple[str, int]] = set()
"""Ports this process already picked: the OS may hand a released ephemeral port out again at
once, and a second deployment in the same process (a test, a benchmark running two sessions)
must not get a port the first one's servers are about to bind."""


def pick_free_ports(host: str, count: int, *, exclude: set[int] | None = None) -> list[int]:
    """``count`` distinct ports the OS reports free on ``host`` now (bind to port 0).

    All sockets stay open until every port is chosen so the same port is not returned
    twice; ``exclude`` are ports already taken by the caller (fixed ports in a file), and no
    port this process picked before is returned again.
    """
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        attempts = 0
        while len(ports) < count:
            attempts += 1
            if attempts > count + 100:
                raise OSError(f"could not find {count} free ports on {host}")
            sock = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if (exclude and port in exclude) or (host, port) in _HANDED_OUT:
                continue
            ports.append(port)
    _HANDED_OUT.update((host, p) for p in ports)
    return ports
