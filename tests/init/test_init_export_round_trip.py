"""Issue 30's round trip: a winner exported by ``autotune best --export compose|k8s`` and read
back by ``autotune init --from-compose|--from-k8s`` gives the winner's configuration back.

"Back" means: the imported deployment, rendered with the imported space's baseline, starts
every service with the winner's command and environment, word for word, except for the three
rewrites the container exports document (``autotune/export/_containers.py``): the image's
``python3`` for the tuner's interpreter, ``0.0.0.0`` for loopback listen addresses, and
other services' container names in URLs, which ``init`` points back where it runs them (so
those come back exactly). The GPUs come back from the compose ``device_ids`` and the
Kubernetes ``autotune.io/cuda-visible-devices`` annotation; credentials, never written by
either side, come back from the environment ``autotune run`` starts in; the levers'
baseline values are the winner's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest_results import TrialSpec, make_study
from e2e_helpers import autotune_cli
from init_helpers import Init

from autotune.deployment import load_deployment
from autotune.pinned_env import PINNED_ENV
from autotune.render import render
from autotune.results import load_results
from autotune.secrets import REDACTED
from autotune.space import load_space

TOKEN = "hf_CANARYtok3nQ7x9Lp2"
KEY = "sk-CANARYk3yZ81234567"
WINNER = {
    "nccl_proto": "LL",
    "moe_runner_backend": "cutlass",
    "mem_fraction_static": 0.9,
    "max_running_requests": 64,
    "cuda_graph": True,
}
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _in_a_container(argv: list[str]) -> list[str]:
    """The exports' documented rewrites of a command that stay after the import."""
    out = [
        "python3" if i == 0 and Path(w).name.startswith("python") else w for i, w in enumerate(argv)
    ]
    for i in range(len(out) - 1):
        if out[i] in ("--host", "--prometheus-host") and out[i + 1] in _LOOPBACK:
            out[i + 1] = "0.0.0.0"
    return [KEY if w == REDACTED else w for w in out]


@pytest.fixture
def winner(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A stored study whose best trial runs the sim PD deployment with a credential in its
    environment and a secret flag (stored redacted, as autotune stores them)."""
    study = make_study(
        tmp_path / "study",
        [
            TrialSpec(is_baseline=True, throughput=100.0),
            TrialSpec(
                throughput=300.0,
                params=dict(WINNER),
                env={"HF_TOKEN": REDACTED},
                extra_flags=["--api-key", REDACTED],
            ),
        ],
    )
    best = max(load_results(study), key=lambda t: t.values[0] if t.values else 0.0)
    assert best.number == 1
    return tmp_path / "study" / "study.db", {n: s.model_dump() for n, s in best.services.items()}


@pytest.mark.parametrize("fmt", ["compose", "k8s"])
def test_an_exported_winner_imports_back_to_its_configuration(
    fmt: str,
    winner: tuple[Path, dict[str, Any]],
    init: Init,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, services = winner
    out = tmp_path / "exported"
    autotune_cli(
        "best", "--study", "autotune-test", "--storage", f"sqlite:///{db}",
        "--export", fmt, "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    [exported] = out.glob(f"trial-1.{fmt}.yaml")
    assert TOKEN not in exported.read_text()
    result = init(f"--from-{fmt}", str(exported), name=fmt)
    dep_file, space_file, _ = init.files(fmt)
    written = "".join(p.read_text() for p in init.files(fmt))
    assert TOKEN not in written and KEY not in written
    for var in ("HF_TOKEN", "AUTOTUNE_SECRET_API_KEY"):
        assert f"export {var}" in result.output

    dep = yaml.safe_load(dep_file.read_text())
    assert list(dep["services"]) == ["prefill", "decode", "router"]  # the winner's names
    assert dep["services"]["router"]["depends_on"] == ["prefill", "decode"]
    assert dep["endpoint"] == "http://${router.host}:${router.port}"

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("AUTOTUNE_SECRET_API_KEY", KEY)
    space = load_space(space_file)
    specs = render(space, load_deployment(dep_file), space.baseline_config())
    for name, record in services.items():
        spec = specs[name]
        assert list(spec.argv) == _in_a_container(record["argv"]), name
        want = {k: (TOKEN if v == REDACTED else v) for k, v in record["env"].items()}
        got = {k: v for k, v in spec.env.items() if k not in PINNED_ENV}
        assert got == want, name
    # The levers start where the winner is.
    baseline = dict(space.baseline_config())
    assert baseline["nccl_proto"] == WINNER["nccl_proto"]
    assert baseline["moe_runner_backend"] == WINNER["moe_runner_backend"]
    assert baseline["mem_fraction_static"] == WINNER["mem_fraction_static"]


def test_init_says_a_containers_program_runs_here(init: Init, tmp_path: Path) -> None:
    """What init says about a container's program: it runs on this machine."""
    compose = tmp_path / "c.yaml"
    compose.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "server": {
                        "image": "vllm/vllm-openai:v0.32.0",
                        "entrypoint": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                        "command": ["--model", "/m", "--port", "8000"],
                    }
                }
            }
        )
    )
    result = init("--from-compose", str(compose))
    assert "its program (python3) must exist here" in result.output
