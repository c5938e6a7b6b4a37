"""The baseline ``autotune init`` writes is exactly what runs now, for every bundled deployment.

Each ``launchers/*.yaml`` is rendered as it runs (its command lines and environments, ports
picked), each service's paste-able command line (``ServiceSpec.command_line``: ``env A=1 prog
...``) goes to ``autotune init --from-command``, and the written deployment rendered with the
written space's baseline must give the same argv and environment back, service by service.
The written space must pass ``autotune space check`` (the real command, on the written
deployment).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from e2e_helpers import autotune_cli
from init_helpers import REPO, Init

from autotune.deployment import load_deployment
from autotune.render import render
from autotune.space import load_space

BUNDLED = sorted((REPO / "launchers").glob("*.yaml"))


@pytest.mark.parametrize("launcher", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_init_gives_back_every_bundled_deployments_commands(launcher: Path, init: Init) -> None:
    today = render(None, load_deployment(launcher), {})
    args = [a for spec in today.values() for a in ("--from-command", spec.command_line())]
    init(*args, name="rt")
    dep_file, space_file, study_file = init.files("rt")
    deployment, space = load_deployment(dep_file), load_space(space_file)
    again = render(space, deployment, space.baseline_config())
    assert len(again) == len(today)
    for (name, before), after in zip(today.items(), again.values(), strict=True):
        assert list(after.argv) == list(before.argv), name
        assert after.env == before.env, name
        assert after.port == before.port and after.host == before.host, name
    study = yaml.safe_load(study_file.read_text())
    assert study["space"] == "../search_spaces/rt.yaml"
    assert study["deployment"] == "../launchers/rt.yaml"
    assert space.params, "a space with levers"


def test_the_round_trip_names_and_orders_a_pd_deployment(init: Init) -> None:
    today = render(None, load_deployment(REPO / "launchers" / "sim-dsv4-flash-pd.yaml"), {})
    # The router first on the command line: the file still starts it after its workers.
    order = ["router", "prefill", "decode"]
    init(*[a for n in order for a in ("--from-command", today[n].command_line())])
    dep, space, _ = init.load()
    assert list(dep["services"]) == ["prefill", "decode", "router"]
    assert dep["services"]["router"]["depends_on"] == ["prefill", "decode"]
    assert dep["endpoint"] == "http://${router.host}:${router.port}"
    assert dep["services"]["router"]["health"]["url"].endswith("/readiness")
    assert dep["services"]["prefill"]["info_url"].endswith("/server_info")
    assert dep["services"]["decode"]["env"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert dep["gpus"] == 8 and dep["sim_speedup"] == 8
    assert dep["model"] == "deepseek-ai/DeepSeek-V4-Flash"
    # NVLink multicast off is autotune's, set in every rendered service: not copied.
    assert "NCCL_NVLS_ENABLE" not in dep["services"]["prefill"]["env"]
    assert space["engine"] == {"name": "sglang", "version": "0.5.23"}
    assert "router" not in space["services"]  # one prefill, one decode: no policy to choose


@pytest.mark.parametrize(
    "launcher", ["vllm-cpu-local", "sim-dsv4-flash-pd", "transformers-serve-cpu"]
)
def test_the_proposed_space_passes_space_check(launcher: str, init: Init, tmp_path: Path) -> None:
    today = render(None, load_deployment(REPO / "launchers" / f"{launcher}.yaml"), {})
    init(*[a for spec in today.values() for a in ("--from-command", spec.command_line())])
    dep_file, space_file, _ = init.files()
    checked = autotune_cli(
        "space",
        "check",
        str(space_file),
        "--deployment",
        str(dep_file),
        "--sample",
        "100",
        cwd=tmp_path,
    )
    assert "ok: " in checked.stdout and "0 error(s)" in checked.stdout, checked.stdout
    assert "FAILED" not in checked.stdout
