"""The command line: every user-facing command, real processes, clear errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import E2E_STUDY, REPO, autotune_cli, load

from autotune.ports import pick_free_port as _free_port

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulated SGLang server (prefill+decode in one process) in a fast configuration."""
    port = _free_port()
    log = tmp_path_factory.mktemp("sim") / "server.log"
    env = {
        **os.environ,
        "AUTOTUNE_SIM_LOAD_SECONDS": "0.1",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
        "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": "true",
    }
    argv = [
        sys.executable,
        "-m",
        "autotune.sim.server",
        "--model-path",
        "/models/DeepSeek-V4-Flash-NVFP4",
        "--quantization",
        "modelopt_fp4",
        "--moe-runner-backend",
        "flashinfer_cutlass",
        "--tp-size",
        "4",
        "--triton-attention-num-kv-splits",
        "8",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_bench_json_against_simulated_server(sim_server: str, tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    out = autotune_cli(
        "bench",
        "--url",
        sim_server,
        "--concurrency",
        "4",
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--requests",
        "8",
        "--records",
        str(records),
        "--json",
        cwd=tmp_path,
    )
    metrics = json.loads(out.stdout)
    assert metrics["completed"] == 8 and metrics["failed"] == 0
    assert metrics["output_throughput"] > 0
    assert set(metrics["tpot_ms"]) >= {"mean", "p50", "p90", "p99"}
    lines = records.read_text().splitlines()
    assert len(lines) == 8
    first = json.loads(lines[0])
    assert first["completion_tokens"] == 8 and len(first["chunk_times"]) >= 1


def test_bench_table_output(sim_server: str, tmp_path: Path) -> None:
    out = autotune_cli(
        "bench",
        "--url",
        sim_server,
        "--concurrency",
        "2",
        "--output-len",
        "4",
        "--requests",
        "2",
        cwd=tmp_path,
    )
    assert "throughput" in out.stdout.lower()


def test_bench_unreachable_is_one_clear_line(tmp_path: Path) -> None:
    port = _free_port()
    out = autotune_cli(
        "bench", "--url", f"http://127.0.0.1:{port}", "--requests", "1", cwd=tmp_path, check=False
    )
    assert out.returncode == 2
    assert f"127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_space_check_bundled(tmp_path: Path) -> None:
    out = autotune_cli("space", "check", str(SPACE), cwd=tmp_path)
    assert "dsv4-flash-rtx6000-pd" in out.stdout
    assert "forbidden" in out.stdout.lower()


def test_space_check_invalid_names_file_field_allowed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPACE.read_text().replace("type: categorical", "type: categorial", 1))
    out = autotune_cli("space", "check", str(bad), cwd=tmp_path, check=False)
    assert out.returncode == 2
    assert str(bad) in out.stderr and "categorical" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--sampler", "bogus"], "tpe"),
        (["best", "--export", "yaml"], "systemd"),
        (["best"], "no study database"),
        (["report"], "no study database"),
        (["run", "--study-file", "missing.yaml"], "missing.yaml"),
        (["run", "--worker", "bad name!"], "--worker"),
        (["run", "--study-file", str(E2E_STUDY), "--deployment", "nope.yaml"], "nope.yaml"),
        (["status"], "no study database"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    out = autotune_cli(
        *args, "--storage", f"sqlite:///{tmp_path / 'none.db'}", cwd=tmp_path, check=False
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_migrate_from_a_missing_database_is_one_line(tmp_path: Path) -> None:
    out = autotune_cli(
        "migrate", "--from", "sqlite:///absent.db", "--to", "sqlite:///b.db", cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "absent.db" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "b.db").exists()


@pytest.mark.slow
def test_multi_objective_study_with_random_sampler(tmp_path: Path) -> None:
    study_file = tmp_path / "mo.yaml"
    study_file.write_text(
        E2E_STUDY.read_text()
        .replace("../../search_spaces", str(REPO / "search_spaces"))
        .replace("../../launchers", str(REPO / "launchers"))
        .replace("objective: throughput", "objective: throughput_vs_tpot")
    )
    db = tmp_path / "mo.db"
    autotune_cli(
        "run",
        "--trials",
        "2",
        "--sampler",
        "random",
        "--seed",
        "1",
        "--study",
        "mo",
        "--storage",
        f"sqlite:///{db}",
        "--study-file",
        str(study_file),
        cwd=tmp_path,
    )
    study = load("mo", db)
    assert study.metric_names == ["output_throughput_tok_s", "tpot_p99_ms"]
    assert len(study.directions) == 2
    assert all(t.values is not None and len(t.values) == 2 for t in study.trials)
    best = autotune_cli("best", "--study", "mo", "--storage", f"sqlite:///{db}", cwd=tmp_path)
    assert "best feasible trial" in best.stdout


def test_best_prints_mean_ci_and_n_and_ranks_by_the_lower_bound(tmp_path: Path) -> None:
    from conftest_results import BASELINE_PARAMS, TrialSpec, make_study

    from autotune.results import remeasure_key

    def params(mem: float) -> dict[str, object]:
        return {**BASELINE_PARAMS, "mem_fraction_static": mem}

    study = make_study(
        tmp_path,
        [
            TrialSpec(throughput=25.0, is_baseline=True, params=params(0.88)),
            TrialSpec(throughput=1000.0, params=params(0.70)),  # one lucky run
            TrialSpec(throughput=980.0, params=params(0.71)),
            TrialSpec(throughput=500.0, params=params(0.72)),
        ],
    )
    for of, value in ((2, 990.0), (3, 520.0)):
        study.set_user_attr(
            remeasure_key(of, 1),
            {"of": of, "repeat": 1, "feasible": True, "metrics": {"output_throughput": value}},
        )
    url = f"sqlite:///{tmp_path / 'study.db'}"
    out = autotune_cli("best", "--study", "autotune-test", "--storage", url, cwd=tmp_path)
    text = " ".join(out.stdout.split())
    assert "best feasible trial #2" in text
    assert "985.0 +- " in text and "(95% CI, n=2)" in text
    assert "conservative estimate" in text and "lower 95% bound" in text
    assert "trial #2: 980.0; re-run 1: 990.0" in text
    assert "│ gain over baseline │ 39.4x" in text  # the mean over the baseline's 25 tok/s


def test_bench_runs_an_open_loop_on_a_shared_prefix_dataset(tmp_path: Path) -> None:
    """`autotune bench --request-rate` on a real server: an open loop, reported with its
    offered rate and send lag; dataset options of another kind are refused by name."""
    sys.path.insert(0, str(Path(__file__).parent / "loadgen"))
    from fake_openai_server import serve

    with serve() as server:
        out = autotune_cli(
            "bench", "--url", server.url, "--request-rate", "50", "--requests", "20",
            "--warmup", "0", "--dataset", "shared_prefix", "--gsp-groups", "2",
            "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "16",
            "--gsp-question-len", "4", "--output-len", "4", "--json",
            cwd=tmp_path,
        )  # fmt: skip
        metrics = json.loads(out.stdout)
        assert metrics["completed"] == 20 and metrics["arrival_rate"] > 0
        assert metrics["send_lag_ms"]["p99"] is not None
        heads = {tuple(p["prompt"][:16]) for p in server.payloads}
        assert len(heads) == 2
        bad = autotune_cli(
            "bench", "--url", server.url, "--range-ratio", "0.5", "--dataset", "sharegpt",
            cwd=tmp_path, check=False,
        )  # fmt: skip
        assert bad.returncode == 2 and "--range-ratio" in bad.stderr and "random" in bad.stderr
        bad = autotune_cli(
            "bench", "--url", server.url, "--burstiness", "0.5", cwd=tmp_path, check=False
        )
        assert bad.returncode == 2 and "--request-rate" in bad.stderr


def test_say_never_wraps_what_scripts_read(capsys: pytest.CaptureFixture[str]) -> None:
    """Output that is not a terminal is 80 columns to rich: a long path printed through the
    shared console would break in two (`best --export` printed its files so)."""
    from autotune.cli._common import console, say

    path = "/tmp/" + "/".join(["a-rather-long-directory-name"] * 20) + "/trial-1-minimal.env.sh"
    assert console.width < len(path)
    say(path)
    say(f"report written: {path} [bold]x[/]", err=True)
    out, err = capsys.readouterr()
    assert out == path + "\n"
    assert err == f"report written: {path} [bold]x[/]\n"  # no markup either
