"""``autotune best --export compose|k8s`` as a user runs it: printed or written with --out,
``--image``, the minimal winner, clear errors; and a trial the simulated deployment really
ran (``autotune run``), exported and validated.

In-process (typer's CliRunner: stdout and stderr apart) on studies from the shared factory,
except the last test, which tunes the bundled simulated deployment for one trial.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from conftest_results import BASELINE_PARAMS, TrialSpec, make_study, metrics, services
from container_cases import REPO, compose_errors, validate_k8s
from e2e_helpers import E2E_STUDY, autotune_cli
from typer.testing import CliRunner

from autotune.cli import app
from autotune.explain import ExplainRun, Explanation, Interval, Measured, Minimal
from autotune.explain.record import RESULT_ATTR, run_key

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
STUDY = "autotune-test"
WINNER = {**BASELINE_PARAMS, "moe_runner_backend": "cutlass", "mem_fraction_static": 0.8}
MINIMAL = {**BASELINE_PARAMS, "moe_runner_backend": "cutlass"}


@pytest.fixture()
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Baseline (#0) and winner (#1), and an explanation whose minimal winner dropped
    mem_fraction_static (its run started the services with the baseline's 0.88)."""
    monkeypatch.chdir(tmp_path)
    study = make_study(
        tmp_path / "db",
        [TrialSpec(throughput=25.0, is_baseline=True), TrialSpec(throughput=900.0, params=WINNER)],
        name=STUDY,
    )
    _explain(study)
    return f"sqlite:///{tmp_path / 'db' / 'study.db'}"


def _explain(study: optuna.Study) -> None:
    def measured(key: str, mean: float) -> Measured:
        return Measured(
            key=key, n=2, values=[mean] * 2, mean=Interval(value=mean, low=mean - 9, high=mean + 9)
        )

    explanation = Explanation(
        winner=1,
        unit="tok/s",
        objective="output throughput",
        tolerance=0.03,
        winner_config=dict(WINNER),
        baseline_config=dict(BASELINE_PARAMS),
        winner_measured=measured("k-winner", 900.0),
        baseline_measured=measured("k-base", 25.0),
        minimal=Minimal(
            kept=["moe_runner_backend"],
            dropped=["mem_fraction_static"],
            config=dict(MINIMAL),
            measured=measured("k-min", 890.0),
            ratio=Interval(value=0.99, low=0.97, high=1.0),
            decisions=[],
            complete=True,
        ),
        runs=4,
        complete=True,
    )
    run = ExplainRun(
        key="k-min",
        index=0,
        config={**MINIMAL, "speculative_num_draft_tokens": 4},
        values=[890.0],
        feasible=True,
        metrics=metrics(890.0, 40.0),
        services=services(MINIMAL),  # type: ignore[arg-type]
        engine_version={},
    )
    study.set_user_attr(RESULT_ATTR, explanation.model_dump(mode="json"))
    study.set_user_attr(run_key(run.key, run.index), run.model_dump(mode="json"))


def best(storage: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        app, ["best", "--study", STUDY, "--storage", storage, *args], env={"COLUMNS": "200"}
    )
    return result.exit_code, result.stdout, result.stderr


def test_k8s_is_printed_and_notes_go_to_stderr(storage: str) -> None:
    code, out, err = best(storage, "--export", "k8s")
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == ["Deployment", "Service"] * 3
    for doc in docs:
        validate_k8s(doc)
        assert doc["metadata"]["annotations"]["autotune.io/study"] == STUDY
        assert doc["metadata"]["annotations"]["autotune.io/trial"] == "1"
    assert "note: service 'prefill': no default image" in err  # the simulated server's
    args = docs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--mem-fraction-static") + 1] == "0.8"  # the winner's


def test_compose_is_written_with_out_and_takes_images(storage: str, tmp_path: Path) -> None:
    out_dir = tmp_path / "deploy"
    code, out, err = best(
        storage, "--export", "compose", "--out", str(out_dir),
        "--image", "reg.example/sim:1", "--image", "router=lmsysorg/sglang:v0.5.23",
    )  # fmt: skip
    assert code == 0, err
    path = out_dir / "trial-1.compose.yaml"
    assert out.split() == [str(path)]
    doc = yaml.safe_load(path.read_text())
    assert compose_errors(doc) == []
    assert {n: s["image"] for n, s in doc["services"].items()} == {
        "prefill": "reg.example/sim:1",
        "decode": "reg.example/sim:1",
        "router": "lmsysorg/sglang:v0.5.23",
    }
    assert "no default image" not in err


def test_the_minimal_winner_is_exported(storage: str) -> None:
    code, out, err = best(storage, "--minimal", "--export", "k8s")
    assert code == 0, err
    deployment = next(yaml.safe_load_all(out.split("\n---\n", 1)[1]))
    assert deployment["metadata"]["annotations"]["autotune.io/minimal-winner"] == "true"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--mem-fraction-static") + 1] == "0.88"  # dropped: the baseline's
    assert "trial 1 (minimal winner)" in out
    code, out, err = best(storage, "--minimal", "--export", "compose")
    assert code == 0, err
    labels = yaml.safe_load(out)["services"]["router"]["labels"]
    assert labels["autotune.io/minimal-winner"] == "true"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--export", "helm"], "field '--export': unknown export format 'helm' (allowed: "
         "systemd, env, command, json, compose, k8s)"),
        (["--export", "json", "--image", "x/y:1"], "field '--image': --image is for --export "
         "compose or k8s, not json (allowed: compose, k8s)"),
        (["--image", "x/y:1"], "field '--image': --image is for --export compose or k8s "
         "(allowed: compose, k8s)"),
        (["--export", "k8s", "--image", "gpu=x/y:1"], "field '--image': --image 'gpu=x/y:1': "
         "the trial has no service 'gpu' (allowed: decode, prefill, router)"),
        (["--export", "systemd"], "--export systemd writes files: give --out DIR"),
    ],
)  # fmt: skip
def test_bad_options_are_clear_errors(storage: str, args: list[str], message: str) -> None:
    code, out, err = best(storage, *args)
    assert code == 2 and out == ""
    assert message in " ".join(err.split()), err


def test_out_that_is_a_file_is_refused_before_any_work(storage: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    code, _, err = best(storage, "--export", "k8s", "--out", str(tmp_path / "f"))
    assert code == 2 and "exists and is not a directory" in err


@pytest.mark.slow
def test_a_trial_the_simulated_deployment_ran_exports_and_validates(tmp_path: Path) -> None:
    study_file = tmp_path / "e2e.yaml"
    study_file.write_text(
        E2E_STUDY.read_text()
        .replace("../../search_spaces", str(REPO / "search_spaces"))
        .replace("../../launchers", str(REPO / "launchers"))
    )
    url = f"sqlite:///{tmp_path / 'e2e.db'}"
    common = ["--study", "e2e", "--storage", url, "--study-file", str(study_file)]
    autotune_cli("run", "--trials", "1", "--seed", "3", *common, cwd=tmp_path)
    stored = optuna.load_study(study_name="e2e", storage=url).trials[0].user_attrs["services"]
    out = tmp_path / "out"
    for fmt in ("k8s", "compose"):
        done = autotune_cli("best", *common, "--export", fmt, "--out", str(out), cwd=tmp_path)
        assert done.stdout.split() == [str(out / f"trial-0.{fmt}.yaml")]
    docs = [d for d in yaml.safe_load_all((out / "trial-0.k8s.yaml").read_text()) if d]
    for doc in docs:
        validate_k8s(doc)
    compose = yaml.safe_load((out / "trial-0.compose.yaml").read_text())
    assert compose_errors(compose) == []
    # What really ran: the router's readiness URL, the tuner's interpreter, the ports.
    router = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "router"
    )
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert stored["router"]["argv"][0] == sys.executable and container["command"][0] == "python3"
    assert container["args"] == compose["services"]["router"]["command"]
    port = stored["prefill"]["argv"][stored["prefill"]["argv"].index("--port") + 1]
    assert f"http://prefill:{port}" in container["args"]
    assert json.loads(json.dumps(compose["services"]["router"]["depends_on"])) == {
        "prefill": {"condition": "service_healthy"},
        "decode": {"condition": "service_healthy"},
    }
