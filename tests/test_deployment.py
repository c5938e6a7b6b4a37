"""Deployment files: bundled ones load; every mistake is a ConfigError naming file/field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autotune.deployment import available_deployments, load_deployment
from autotune.errors import ConfigError

GOOD = """
name: tiny
endpoint: http://${router.host}:${router.port}
services:
  worker:
    command: ["${python}", -m, http.server, --bind, "${host}", "${port}"]
    port: auto
  router:
    command: [router, --worker, "http://${worker.host}:${worker.port}", --port, "${port}"]
    port: 18000
    depends_on: [worker]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dep.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_for(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_deployment(path)
    assert info.value.file == str(path)
    assert str(path) in str(info.value)
    return info.value


def test_bundled_deployments_load() -> None:
    names = available_deployments()
    assert {"sim-dsv4-flash-pd", "dsv4-flash-pd-local"} <= set(names)
    sim = load_deployment("sim-dsv4-flash-pd")
    assert list(sim.services) == ["prefill", "decode", "router"]
    assert sim.services["router"].depends_on == ["prefill", "decode"]
    assert sim.model == "deepseek-ai/DeepSeek-V4-Flash"
    real = load_deployment("dsv4-flash-pd-local")
    assert real.services["prefill"].wrapper == ["numactl", "--cpunodebind=0", "--membind=0"]
    assert real.services["decode"].env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert real.endpoint_url() == "http://127.0.0.1:8000"


def test_auto_ports_are_free_distinct_and_stable(tmp_path: Path) -> None:
    dep = load_deployment(write(tmp_path, GOOD))
    ports = dep.ports()
    assert ports["router"] == 18000 and ports["worker"] not in (0, 18000)
    assert dep.ports() == ports  # chosen once per Deployment object
    assert dep.endpoint_url() == "http://127.0.0.1:18000"


def test_run_dir_and_endpoint_from_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    dep = load_deployment(write(tmp_path, GOOD))
    assert dep.default_run_dir() == tmp_path / "studies" / "runs" / "tiny"
    assert dep.default_run_dir("s1") == tmp_path / "studies" / "runs" / "tiny" / "s1"
    from autotune.render import render

    specs = render(None, dep, {}, run_dir=tmp_path)
    moved = {**specs, "router": specs["router"].model_copy(update={"port": 18001})}
    assert dep.endpoint_url(moved) == "http://127.0.0.1:18001"


def test_unknown_name_lists_bundled(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_deployment("no-such-deployment")
    assert info.value.field == "deployment"
    assert "sim-dsv4-flash-pd" in (info.value.allowed or [])


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    err = error_for(tmp_path, "name: x\nservices:\n  a: [1, 2\n  b: 3\n")
    assert "YAML syntax error at line" in str(err)


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    assert "expected a mapping" in str(error_for(tmp_path, "- 1\n- 2\n"))


def test_unknown_key_lists_allowed(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("    port: auto", "    port: auto\n    prot: 1"))
    assert err.field == "services.worker.prot"
    assert err.allowed is not None and "port" in err.allowed and "depends_on" in err.allowed
    err = error_for(tmp_path, GOOD.replace("name: tiny", "name: tiny\nendpoints: x"))
    assert err.field == "endpoints" and "endpoint" in (err.allowed or [])


def test_template_unknown_name(tmp_path: Path) -> None:
    typo = GOOD.replace('"${port}"]\n    port: auto', '"${prot}"]\n    port: auto')
    err = error_for(tmp_path, typo)
    assert err.field == "services.worker.command[5]"
    assert "${prot}" in str(err) and "${port}" in (err.allowed or [])
    assert "${worker.port}" in (err.allowed or [])
    # ${host}/${port} only exist inside a service
    err = error_for(tmp_path, GOOD.replace("http://${router.host}", "http://${host}"))
    assert err.field == "endpoint" and "${host}" not in (err.allowed or [])
    # ${model} only when model is set
    err = error_for(tmp_path, GOOD.replace("--port, ", "--model, '${model}', --port, "))
    assert err.field == "services.router.command[4]"


def test_depends_on_unknown_and_cycle(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("depends_on: [worker]", "depends_on: [wrker]"))
    assert err.field == "services.router.depends_on[0]" and err.allowed == ["worker"]
    cyc = GOOD.replace("    port: auto", "    port: auto\n    depends_on: [router]")
    err = error_for(tmp_path, cyc)
    assert "cycle" in str(err) and "worker -> router -> worker" in str(err)
    err = error_for(tmp_path, GOOD.replace("depends_on: [worker]", "depends_on: [router]"))
    assert "itself" in str(err)


def test_ports_unique_per_host(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("port: auto", "port: 18000"))
    assert err.field == "services.router.port" and "worker" in str(err)
    other_host = GOOD.replace("port: auto", "port: 18000\n    host: 127.0.0.2")
    assert load_deployment(write(tmp_path, other_host)).ports()["worker"] == 18000


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ("port: auto", "port: 70000", "services.worker.port", "1..65535"),
        ("port: auto", "port: automatic", "services.worker.port", "auto"),
        (
            'command: ["${python}", -m, http.server, --bind, "${host}", "${port}"]',
            "command: []",
            "services.worker.command",
            "at least 1",
        ),
        ("--port, ", "--port, 8, ", "services.router.command[4]", "quote it"),
        ("    port: 18000\n", "", "services.router.port", "required"),
        ("name: tiny", "name: 'tiny dep'", "name", "pattern"),
    ],
)
def test_field_errors(tmp_path: Path, old: str, new: str, field: str, words: str) -> None:
    assert old in GOOD
    err = error_for(tmp_path, GOOD.replace(old, new, 1))
    assert err.field == field
    assert words in str(err)


EXTRA = """
name: extra
endpoint: http://${router.host}:${router.port}
services:
  worker:
    command: [w, --port, "${port}", --bootstrap-port, "${ports.bootstrap}"]
    port: auto
    ports: {bootstrap: auto, debug: 18002}
  router:
    command: [r, --worker, "http://${worker.host}:${worker.port}", "${worker.ports.bootstrap}",
              --port, "${port}", --prometheus-port, "${ports.prometheus}"]
    port: 18000
    ports: {prometheus: auto}
    depends_on: [worker]
"""


def test_extra_ports_are_free_distinct_stable_and_templated(tmp_path: Path) -> None:
    from autotune.render import render

    dep = load_deployment(write(tmp_path, EXTRA))
    extra = dep.extra_ports()
    assert extra["worker"]["debug"] == 18002 and extra == dep.extra_ports()  # chosen once
    picked = [dep.ports()["worker"], extra["worker"]["bootstrap"], extra["router"]["prometheus"]]
    assert len(set(picked)) == 3 and not set(picked) & {18000, 18002}
    specs = render(None, dep, {}, run_dir=tmp_path)
    assert specs["worker"].argv[-1] == str(extra["worker"]["bootstrap"])
    router = list(specs["router"].argv)
    assert router[3] == str(extra["worker"]["bootstrap"])
    assert router[-1] == str(extra["router"]["prometheus"])
    other = load_deployment(write(tmp_path, EXTRA))  # another session: other free ports
    assert other.extra_ports()["worker"]["bootstrap"] != extra["worker"]["bootstrap"]


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ("{bootstrap: auto, debug: 18002}", "{bootstrap: 70000}", "services.worker.ports.bootstrap",
         "1..65535"),
        ("{bootstrap: auto, debug: 18002}", "{bootstrap: automatic}",
         "services.worker.ports.bootstrap", "'auto'"),
        ("{bootstrap: auto, debug: 18002}", "{bootstrap: true}", "services.worker.ports.bootstrap",
         "1..65535"),
        ("{bootstrap: auto, debug: 18002}", "{bootstrap: auto, a.b: 1}",
         "services.worker.ports.a.b", "no dots"),
        ("debug: 18002", "debug: 18000", "services.router.port", "service 'worker' (ports.debug)"),
        ('"${ports.bootstrap}"]', '"${ports.bootsrap}"]', "services.worker.command[4]",
         "${ports.bootsrap}"),
        ('"${worker.ports.bootstrap}"', '"${worker.ports.nope}"', "services.router.command[3]",
         "${worker.ports.nope}"),
        ('"${ports.prometheus}"]', '"${ports.bootstrap}"]', "services.router.command[7]",
         "${ports.bootstrap}"),
    ],
)  # fmt: skip
def test_extra_port_errors(tmp_path: Path, old: str, new: str, field: str, words: str) -> None:
    assert old in EXTRA
    err = error_for(tmp_path, EXTRA.replace(old, new, 1))
    assert err.field == field and words in str(err)


def test_extra_port_errors_list_the_allowed_names(tmp_path: Path) -> None:
    err = error_for(tmp_path, EXTRA.replace('"${ports.bootstrap}"]', '"${ports.bootsrap}"]'))
    assert "${ports.bootstrap}" in (err.allowed or []) and "${ports.debug}" in (err.allowed or [])
    assert "${ports.prometheus}" not in (err.allowed or [])  # the router's, not the worker's
    assert "${router.ports.prometheus}" in (err.allowed or [])


def test_extra_ports_on_an_ssh_host_must_be_fixed(tmp_path: Path) -> None:
    ssh = EXTRA.replace(
        "services:\n  worker:\n",
        "hosts:\n  gpu: {address: 10.0.0.5, user: root, key_file: /k}\n"
        "services:\n  worker:\n    on: gpu\n",
    ).replace("    port: auto\n    ports: {bootstrap", "    port: 17000\n    ports: {bootstrap")
    err = error_for(tmp_path, ssh)
    assert err.field == "services.worker.ports.bootstrap" and "fixed ports" in str(err)
    fixed = ssh.replace("{bootstrap: auto, debug: 18002}", "{bootstrap: 17001}")
    assert load_deployment(write(tmp_path, fixed)).extra_ports()["worker"] == {"bootstrap": 17001}


REPLICAS = """
name: replicas
endpoint: http://${router.host}:${router.port}
services:
  worker:
    command: [srv, --port, "${port}"]
    port: auto
  worker-b:
    command: [srv, --port, "${port}"]
    port: auto
    role: worker
  router:
    command: [router, --port, "${port}"]
    port: auto
    depends_on: [worker, worker-b]
"""


def test_replicas_take_the_levers_of_their_role(tmp_path: Path) -> None:
    from autotune.render import render
    from autotune.space.settings import ServiceSettings

    class Space:
        services = ["worker"]

        def settings_for(self, service: str, config: object) -> ServiceSettings:
            assert service == "worker"
            return ServiceSettings(flags={"--max-running-requests": "32"})

    dep = load_deployment(write(tmp_path, REPLICAS))
    assert dep.roles() == {"worker": ["worker", "worker-b"], "router": ["router"]}
    specs = render(Space(), dep, {}, run_dir=tmp_path)
    for name in ("worker", "worker-b"):
        assert specs[name].argv[-2:] == ("--max-running-requests", "32"), name
        assert specs[name].settings_of == "worker"
    assert "--max-running-requests" not in specs["router"].argv
    assert specs["router"].settings_of == "router"


@pytest.mark.parametrize(
    ("role", "message"),
    [
        ("worker-b", "not of itself or of another replica"),  # itself
        ("router!", "must be letters"),
    ],
)
def test_bad_role_is_one_clear_error(tmp_path: Path, role: str, message: str) -> None:
    err = error_for(tmp_path, REPLICAS.replace("role: worker", f"role: '{role}'"))
    assert err.field == "services.worker-b.role"
    assert message in str(err)


def test_a_replica_of_a_replica_is_refused(tmp_path: Path) -> None:
    text = REPLICAS.replace(
        "  router:\n",
        "  worker-c:\n    command: [srv]\n    port: auto\n    role: worker-b\n  router:\n",
    )
    err = error_for(tmp_path, text)
    assert err.field == "services.worker-c.role"
    assert err.allowed == ["router", "worker"]


def test_a_space_service_missing_as_service_and_role(tmp_path: Path) -> None:
    from autotune.render import render

    class Space:
        services = ["decode"]

        def settings_for(self, service: str, config: object) -> object:
            raise AssertionError

    dep = load_deployment(write(tmp_path, REPLICAS))
    with pytest.raises(ConfigError, match="as a service or a role") as info:
        render(Space(), dep, {}, run_dir=tmp_path)  # type: ignore[arg-type]
    assert info.value.allowed == ["worker", "router"]
