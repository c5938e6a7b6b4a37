"""Every server autotune starts listens on loopback unless told otherwise.

The simulated servers are started for real, without ``--host`` (their default must be
127.0.0.1) and with ``--host 127.0.0.2`` (an explicit address is honoured; a second
loopback address keeps the test off the network); a prefill's KV bootstrap server listens on
the same address. The real SGLang router (sglang-router) binds 0.0.0.0 by default, for its
API and its Prometheus exporter alike, so the bundled deployments pass ``--host`` and
``--prometheus-host``: with them it listens on that address only. The listening socket's
address is read from ``/proc/net/tcp``. The bundled simulated deployments must render
loopback addresses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from net_helpers import stop, wait_listening

from autotune.deployment import load_deployment
from autotune.ports import pick_free_port as free_port
from autotune.render import render
from autotune.space import load_space

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)
SECOND_LOOPBACK = "0200007F"  # 127.0.0.2

pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc/net/tcp"
)


@contextmanager
def serving(args: list[str], port: int, *also: int) -> Iterator[set[str]]:
    """Run ``python -m ARGS`` until it listens on ``port`` (and the ports ``also``); yield
    the addresses listening on any of them."""
    env = {**os.environ, "AUTOTUNE_SIM_LOAD_SECONDS": "0.05"}
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        addrs = set()
        for p in (port, *also):
            addrs |= wait_listening(proc, p, what=args[0], timeout_s=20)
        yield addrs
    finally:
        stop(proc)


SERVER = ["autotune.sim.server", "--model-path", "/models/DeepSeek-V4-Flash", "--tp-size", "4"]
ROUTER = [
    "sglang_router.launch_router",
    "--pd-disaggregation",
    "--prefill",
    "http://127.0.0.1:9",
    "--decode",
    "http://127.0.0.1:9",
    "--disable-health-check",
]


@pytest.mark.parametrize("mode", ["null", "prefill"])
def test_simulated_servers_bind_loopback_by_default(mode: str) -> None:
    program = [*SERVER, "--disaggregation-mode", mode]
    for host, expected in ((None, LOOPBACK), ("127.0.0.2", SECOND_LOOPBACK)):
        port, bootstrap = free_port(), free_port()
        args = [*program, "--port", str(port), "--disaggregation-bootstrap-port", str(bootstrap)]
        args += ["--host", host] if host else []
        also = (bootstrap,) if mode == "prefill" else ()
        with serving(args, port, *also) as addrs:
            assert addrs == {expected}  # 127.0.0.2: the address is really the flag's


def test_router_binds_the_given_addresses_only() -> None:
    """The real router with the bundled deployments' --host and --prometheus-host."""
    port, prometheus = free_port(), free_port()
    args = [*ROUTER, "--port", str(port), "--prometheus-port", str(prometheus)]
    args += ["--host", "127.0.0.2", "--prometheus-host", "127.0.0.2"]
    with serving(args, port, prometheus) as addrs:
        assert addrs == {SECOND_LOOPBACK}


@pytest.mark.parametrize(
    "path", sorted((REPO / "launchers").glob("sim-*.yaml")), ids=lambda p: p.name
)
def test_bundled_simulated_deployments_render_loopback(path: Path, tmp_path: Path) -> None:
    space = load_space(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml")
    deployment = load_deployment(path)
    specs = render(space, deployment, space.baseline_config(), run_dir=tmp_path)
    assert specs
    for name, spec in specs.items():
        argv = list(spec.argv)
        assert spec.host == "127.0.0.1", name
        assert argv[argv.index("--host") + 1] == "127.0.0.1", name
        if "sglang_router.launch_router" in argv:  # its exporter's default is 0.0.0.0
            assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1", name
        assert spec.health_url.startswith("http://127.0.0.1:"), name
    for name, host in deployment.hosts.items():
        assert host.address == "127.0.0.1", name
