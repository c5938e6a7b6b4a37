"""Helpers to run simulated servers as real subprocesses on free loopback ports."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import aiohttp
import httpx
import pytest

from autotune.ports import pick_free_port as free_port
from autotune.sim.levers import levers_to_command

FAST_LEVERS: dict[str, object] = {
    "pcie_ipc_allreduce": True,
    "moe_runner_backend": "flashinfer_cutlass",
    "checkpoint": "nvfp4",
    "speculative": "off",
    "cuda_graph_max_bs_decode": 16,
    "sm120_flashmla_backend": "flashinfer",
    "sm120_direct_swa_kv": True,
}


ROUTER_MODULE = "sglang_router.launch_router"


def router_argv(
    prefill: str, decode: str, bootstrap: int | None, *, port: int, prometheus: int
) -> list[str]:
    """The real router's flags as the bundled sim deployment gives them."""
    return [
        "--pd-disaggregation",
        "--prefill",
        prefill,
        str(bootstrap) if bootstrap is not None else "none",
        "--decode",
        decode,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prometheus),
        "--log-level",
        "warn",
        "--disable-circuit-breaker",
        "--disable-retries",
        "--disable-health-check",
        "--worker-startup-check-interval",
        "1",
        "--shutdown-grace-period-secs",
        "1",
    ]


class Proc:
    """One server/router subprocess with its log files."""

    def __init__(
        self, module: str, argv: Sequence[str], env: Mapping[str, str], log_dir: Path, name: str
    ) -> None:
        self.out = log_dir / f"{name}.out"
        self.err = log_dir / f"{name}.err"
        self.bootstrap_port: int | None = None
        """A prefill server's --disaggregation-bootstrap-port (its KV bootstrap server)."""
        full_env = {**os.environ, "AUTOTUNE_SIM_LOAD_SECONDS": "0.2", **env}
        self.t_start = time.monotonic()
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", module, *argv],
                stdout=out,
                stderr=err,
                env=full_env,
            )

    def log(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def wait_ready(self, url: str, timeout: float = 15.0, path: str = "/health") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise AssertionError(f"exited {self.popen.returncode}:\n{self.log()}")
            try:
                if httpx.get(url + path, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not ready after {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class Launcher:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def server(
        self,
        levers: Mapping[str, object],
        *,
        mode: str = "decode",
        env: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
        name: str = "server",
        direct: bool = True,
    ) -> tuple[Proc, str]:
        """A simulated server on a free port. ``direct``: a PD server (prefill/decode) with
        ``--disaggregation-transfer-backend fake``, which serves requests sent to it
        directly (no bootstrap room, no prefill); otherwise it speaks the PD protocol (a
        prefill gets a free bootstrap port: ``proc.bootstrap_port``)."""
        port = free_port()
        argv, lever_env = levers_to_command(levers, mode=mode, port=port)
        pd: list[str] = []
        if mode in ("prefill", "decode") and direct:
            pd = ["--disaggregation-transfer-backend", "fake"]
        bootstrap = free_port() if mode == "prefill" and not direct else None
        if bootstrap is not None:
            pd = ["--disaggregation-bootstrap-port", str(bootstrap)]
        proc = Proc(
            "autotune.sim.server",
            [*argv, *pd, *extra],
            {**lever_env, **(env or {})},
            self.log_dir,
            f"{name}-{port}",
        )
        proc.bootstrap_port = bootstrap
        self.procs.append(proc)
        return proc, f"http://127.0.0.1:{port}"

    def router(
        self, prefill: str, decode: str, bootstrap: int | None, *extra: str
    ) -> tuple[Proc, str]:
        """The real SGLang PD router (sglang-router) in front of ``prefill`` and ``decode``;
        wait for it with ``wait_ready(url, path="/readiness")``."""
        port = free_port()
        argv = router_argv(prefill, decode, bootstrap, port=port, prometheus=free_port())
        env = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # no tokenizer download (the launchers')
        proc = Proc(ROUTER_MODULE, [*argv, *extra], env, self.log_dir, f"router-{port}")
        self.procs.append(proc)
        return proc, f"http://127.0.0.1:{port}"

    def close(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    lau = Launcher(tmp_path_factory.mktemp("sim"))
    yield lau
    lau.close()


async def _one(
    session: aiohttp.ClientSession, url: str, body: dict[str, object]
) -> tuple[int, float, float, float, list[tuple[float, int]]]:
    """Stream one completion: (completion tokens, start, first chunk, end, chunk times)."""
    t0 = time.monotonic()
    first = 0.0
    tokens = 0
    chunks: list[tuple[float, int]] = []
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            piece = obj["choices"][0].get("text", "") if obj["choices"] else ""
            if piece:
                now = time.monotonic()
                first = first or now
                chunks.append((now, len(piece.split())))
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    return tokens, t0, first, time.monotonic(), chunks


def closed_loop(
    url: str, *, concurrency: int, requests: int, input_len: int, output_len: int
) -> dict[str, float]:
    """A tiny bench_serving: C clients, fixed lengths, ignore_eos.

    ``output_throughput`` is over the whole run (first dispatch to last completion);
    ``steady_throughput`` counts streamed tokens between the end of the first wave (the
    start-up ramp through a FIFO prefill) and the last dispatch (when concurrency drops).
    """
    prompt = " ".join(["word"] * input_len)
    body = {
        "model": "deepseek-ai/DeepSeek-V4-Flash",  # the real router requires it
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    Rec = tuple[int, float, float, float, list[tuple[float, int]]]

    async def run() -> list[Rec]:
        left = requests
        out: list[Rec] = []
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as session:

            async def client() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    out.append(await _one(session, url, body))

            await asyncio.gather(*(client() for _ in range(concurrency)))
        return out

    recs = asyncio.run(run())
    start = min(r[1] for r in recs)
    end = max(r[3] for r in recs)
    tpots = [(r[3] - r[2]) / (r[0] - 1) for r in recs if r[0] > 1]
    t_a = sorted(r[3] for r in recs)[min(concurrency, len(recs)) - 1]
    t_b = max(r[1] for r in recs)
    steady = sum(n for r in recs for t, n in r[4] if t_a <= t <= t_b)
    return {
        "output_throughput": sum(r[0] for r in recs) / (end - start),
        "steady_throughput": steady / (t_b - t_a) if t_b > t_a else 0.0,
        "tpot_ms": 1000 * sum(tpots) / len(tpots),
        "ttft_ms": 1000 * sum(r[2] - r[1] for r in recs) / len(recs),
        "tokens": float(sum(r[0] for r in recs)),
        "duration_s": end - start,
    }
