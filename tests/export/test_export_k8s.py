"""``best --export k8s``: a Deployment and a Service per service, checked offline against the
official OpenAPI schemas of Kubernetes 1.33 (``kubernetes-validate``, strict: an unknown
field fails) and the API server's naming rules, for every bundled deployment.

Negative controls break a valid export in one place each and show the validator refuses it
(strict mode included: the same unknown field passes without it), so a passing validation
means something. The container argv, environment, GPUs and probes are checked against the
stored trial with oracles written from the documented format (container_cases.py).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest_results import TrialSpec, make_study, record
from container_cases import (
    K8S_VERSION,
    api_server_problems,
    assert_container_argv,
    bundled_trial,
    cases,
    k8s_expand,
    validate_k8s,
)

from autotune.errors import ConfigError
from autotune.export import export, export_k8s
from autotune.export.credentials import PLACEHOLDER
from autotune.export.k8s import k8s_name
from autotune.results import TrialResult, load_results

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["annotations"]["autotune.io/service"]: d for d in docs if d["kind"] == kind
    }


def one_trial(tmp_path: Path, services: dict[str, dict[str, Any]], **kw: Any) -> TrialResult:
    return load_results(make_study(tmp_path / "db", [TrialSpec(services=services, **kw)]))[0]


@pytest.mark.parametrize(("deployment", "seed"), cases())
def test_every_bundled_deployment_exports_valid_manifests(
    tmp_path: Path, deployment: str, seed: int | None
) -> None:
    trial = bundled_trial(tmp_path, deployment, seed=seed)
    docs = docs_of(export_k8s(trial, study="my-study"))
    for doc in docs:
        validate_k8s(doc)
        assert api_server_problems(doc) == []
    # A Deployment then a Service per service, in start order (workers before the router).
    names = [d["metadata"]["annotations"]["autotune.io/service"] for d in docs]
    assert names[::2] == names[1::2] and set(names) == set(trial.services)
    assert [d["kind"] for d in docs] == ["Deployment", "Service"] * len(trial.services)
    if "router" in trial.services:
        assert names[-1] == "router"
    hostnames = {n: k8s_name(n) for n in trial.services}
    deployments, services = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    for name, rec in trial.services.items():
        dep, svc = deployments[name], services[name]
        assert dep["metadata"]["name"] == svc["metadata"]["name"] == hostnames[name]
        assert dep["metadata"]["annotations"]["autotune.io/study"] == "my-study"
        assert dep["metadata"]["annotations"]["autotune.io/trial"] == str(trial.number)
        pod = dep["spec"]["template"]
        assert pod["metadata"]["labels"] == dep["spec"]["selector"]["matchLabels"] | {
            k: v for k, v in pod["metadata"]["labels"].items() if k.startswith("autotune.io/")
        }
        assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        argv = [k8s_expand(w, env) for w in container["command"] + container.get("args", [])]
        assert_container_argv(rec.argv, argv, hostnames)
        # The trial's environment, but CUDA_VISIBLE_DEVICES: it became the GPU limit.
        gpus = [g for g in rec.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        want = {k: v for k, v in rec.env.items() if not (gpus and k == "CUDA_VISIBLE_DEVICES")}
        assert {k: k8s_expand(v, env) for k, v in env.items()} == want
        limits = container.get("resources", {}).get("limits", {})
        assert limits.get("nvidia.com/gpu") == (len(gpus) or None)
        if gpus:
            annotations = dep["metadata"]["annotations"]
            assert annotations["autotune.io/cuda-visible-devices"] == ",".join(gpus)
        # Probes on the stored health URL's path and port; the Service exposes every port.
        health = rec.health_url or ""
        path = "/" + health.split("/", 3)[3]
        port = int(health.split("/")[2].rsplit(":", 1)[1])
        for probe in ("startupProbe", "readinessProbe"):
            assert container[probe]["httpGet"] == {"path": path, "port": port}
        assert container["livenessProbe"]["httpGet"]["path"] == (
            "/health" if name == "router" else path
        )
        declared = {p["containerPort"] for p in container["ports"]}
        assert port in declared
        assert {p["port"] for p in svc["spec"]["ports"]} == declared
        deps = rec.depends_on or []
        init = pod["spec"].get("initContainers", [])
        assert bool(init) == bool(deps)
        for dep_name in deps:
            assert any(f"http://{hostnames[dep_name]}:" in w for w in init[0]["command"])


def test_the_simulated_deployment_in_detail(tmp_path: Path) -> None:
    """Ports, URLs, GPUs, images and order of the simulated PD deployment's baseline."""
    trial = bundled_trial(tmp_path, "sim-dsv4-flash-pd")
    said: list[str] = []
    text = export_k8s(trial, study="dsv4-flash-sim", notes=said.append)
    docs = docs_of(text)
    deployments = by_kind(docs, "Deployment")
    router = deployments["router"]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    prefill_port = trial.services["prefill"].argv[
        trial.services["prefill"].argv.index("--port") + 1
    ]
    assert f"http://prefill:{prefill_port}" in args and "--prefill" in args
    assert args[args.index("--host") + 1] == args[args.index("--prometheus-host") + 1] == "0.0.0.0"
    assert router["containers"][0]["image"] == "lmsysorg/sglang:v0.5.23"
    assert [p["name"] for p in router["containers"][0]["ports"]] == ["http", "prometheus"]
    assert router["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readiness"
    prefill = deployments["prefill"]["spec"]["template"]["spec"]
    assert prefill["containers"][0]["image"] == PLACEHOLDER  # the simulated server has none
    assert [p["name"] for p in prefill["containers"][0]["ports"]] == ["http", "bootstrap"]
    assert prefill["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    assert deployments["prefill"]["spec"]["strategy"] == {"type": "Recreate"}
    assert prefill["enableServiceLinks"] is False
    assert any("--image prefill=IMAGE" in n for n in said)
    assert any("--image decode=IMAGE" in n for n in said)
    assert "# note: service 'prefill': no default image" in text
    # The router's init container waits for both workers' health URLs.
    wait = router["initContainers"][0]["command"]
    decode_argv = trial.services["decode"].argv
    decode_port = decode_argv[decode_argv.index("--port") + 1]
    assert wait[:2] == ["python3", "-c"]
    assert [w for w in wait if w.startswith("http://")] == [
        f"http://prefill:{prefill_port}/health",
        f"http://decode:{decode_port}/health",
    ]


MUTATIONS = {
    "unknown field in a container": lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
        {"imagePullPolicyy": "Always"}
    ),
    "containerPort as a string": lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][
        0
    ].update({"containerPort": "http"}),
    "container without a name": lambda d: d["spec"]["template"]["spec"]["containers"][0].pop(
        "name"
    ),
    "probe without a port": lambda d: d["spec"]["template"]["spec"]["containers"][0][
        "readinessProbe"
    ]["httpGet"].pop("port"),
    "replicas as text": lambda d: d["spec"].update({"replicas": "one"}),
    "env value as a number": lambda d: d["spec"]["template"]["spec"]["containers"][0]["env"][
        0
    ].update({"value": 1}),
    "args as one string": lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
        {"args": "--port 8000"}
    ),
    "unknown field at the top": lambda d: d.update({"specs": {}}),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_validator_refuses_a_broken_manifest(tmp_path: Path, mutation: str) -> None:
    trial = bundled_trial(tmp_path, "vllm-h200-dense")
    deployment = docs_of(export_k8s(trial))[0]
    validate_k8s(deployment)
    broken = copy.deepcopy(deployment)
    MUTATIONS[mutation](broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(broken)


def test_strict_mode_is_what_catches_an_unknown_field(tmp_path: Path) -> None:
    service = docs_of(export_k8s(bundled_trial(tmp_path, "vllm-h200-dense")))[1]
    service["spec"]["clusterIPP"] = "None"
    kubernetes_validate.validate(service, K8S_VERSION, strict=False)  # lenient: passes
    with pytest.raises(kubernetes_validate.ValidationError, match="clusterIPP"):
        validate_k8s(service)


def test_secrets_are_secret_key_refs_never_values(tmp_path: Path) -> None:
    rec = record(
        ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000",
         "--api-key", "sk-live-abcdef123456", "--host", "127.0.0.1"],
        {"HF_TOKEN": "hf_supersecretvalue1", "CUDA_VISIBLE_DEVICES": "2"},
        [],
    )  # fmt: skip
    said: list[str] = []
    text = export_k8s(one_trial(tmp_path, {"server": rec}), notes=said.append)
    assert "sk-live-abcdef123456" not in text and "hf_supersecretvalue1" not in text
    (container,) = docs_of(text)[0]["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert refs == {
        "AUTOTUNE_SECRET_API_KEY": {"name": "autotune-secrets", "key": "AUTOTUNE_SECRET_API_KEY"},
        "HF_TOKEN": {"name": "autotune-secrets", "key": "HF_TOKEN"},
    }
    args = container["args"]
    assert args[args.index("--api-key") + 1] == "$(AUTOTUNE_SECRET_API_KEY)"
    assert k8s_expand("$(AUTOTUNE_SECRET_API_KEY)", {"AUTOTUNE_SECRET_API_KEY": "v"}) == "v"
    (note,) = [n for n in said if "Secret" in n]
    assert "kubectl create secret generic autotune-secrets" in note
    assert "--from-literal=HF_TOKEN=..." in note and "never writes credentials" in note
    validate_k8s(docs_of(text)[0])


def test_literal_dollars_survive_kubernetes_expansion(tmp_path: Path) -> None:
    words = ["$(HOME)", "$$", "a$b", "$$(X)", "cost: $5", "$", "x$"]
    rec = record(
        ["/usr/bin/python3", "-m", "mysrv", "--port", "8000", "--tag", *words],
        {"X": "1", "HOME": "/h", "WEIRD": "$(HOME)/$$x"},
        [],
    )
    (deployment, _) = docs_of(export_k8s(one_trial(tmp_path, {"w": rec})))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert [k8s_expand(w, env) for w in container["args"][-len(words) :]] == words
    assert k8s_expand(env["WEIRD"], env) == "$(HOME)/$$x"


def test_images_default_per_engine_and_given(tmp_path: Path) -> None:
    trial = bundled_trial(tmp_path / "a", "vllm-h200-dense")
    image = docs_of(export_k8s(trial))[0]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "vllm/vllm-openai:v0.32.0"  # the trial reported no release: the pinned one
    reported = trial.model_copy(update={"engine_version": {"server": "0.26.0"}})
    text = export_k8s(reported)
    assert "vllm/vllm-openai:v0.26.0" in text and "release its server reported (0.26.0)" in text
    pd = bundled_trial(tmp_path / "b", "dsv4-flash-pd-local")
    images = {
        n: d["spec"]["template"]["spec"]["containers"][0]["image"]
        for n, d in by_kind(
            docs_of(export_k8s(pd, images=["router=reg.example/r:1"])), "Deployment"
        ).items()
    }
    assert images == {
        "prefill": "lmsysorg/sglang:v0.5.23",
        "decode": "lmsysorg/sglang:v0.5.23",
        "router": "reg.example/r:1",
    }
    every = export_k8s(pd, images=["reg.example/all:2", "decode=reg.example/d:3"])
    assert every.count("image: reg.example/all:2") == 3  # prefill, router and its init container
    assert every.count("image: reg.example/d:3") == 1


@pytest.mark.parametrize(
    ("images", "message"),
    [
        (["nope=reg/x:1"], "the trial has no service 'nope'.*allowed: decode, prefill, router"),
        (["reg/x:1", "reg/y:2"], "--image given twice for every service"),
        (["router=bad image"], "is not an image reference"),
        (["router="], "is not an image reference"),
    ],
)
def test_bad_images_are_clear_errors(tmp_path: Path, images: list[str], message: str) -> None:
    trial = bundled_trial(tmp_path, "dsv4-flash-pd-local")
    with pytest.raises(ConfigError, match=message) as err:
        export_k8s(trial, images=images)
    assert err.value.field == "--image"


def test_names_that_collide_as_dns_labels_are_refused(tmp_path: Path) -> None:
    rec = record(["/usr/bin/python3", "-m", "srv", "--port", "1"], {}, [])
    other = record(["/usr/bin/python3", "-m", "srv", "--port", "2"], {}, [])
    trial = one_trial(tmp_path, {"a_b": rec, "a-b": other})
    with pytest.raises(ConfigError, match="would both be named 'a-b'"):
        export_k8s(trial)


def test_the_minimal_winner_is_marked(tmp_path: Path) -> None:
    trial = bundled_trial(tmp_path, "vllm-h200-dense").model_copy(update={"label": "minimal"})
    text = export(trial, fmt="k8s", out_dir=None, notes=None)
    assert isinstance(text, str) and "(minimal winner)" in text
    deployment = docs_of(text)[0]
    assert deployment["metadata"]["annotations"]["autotune.io/minimal-winner"] == "true"
    written = export(trial, fmt="k8s", out_dir=tmp_path / "out", notes=None)
    assert written == [tmp_path / "out" / f"trial-{trial.number}-minimal.k8s.yaml"]


def test_export_refuses_images_for_other_formats(tmp_path: Path) -> None:
    trial = bundled_trial(tmp_path, "vllm-h200-dense")
    with pytest.raises(ConfigError, match="images are for the container formats") as err:
        export(trial, fmt="json", out_dir=None, images=["x/y:1"])
    assert err.value.allowed == ["compose", "k8s"]
