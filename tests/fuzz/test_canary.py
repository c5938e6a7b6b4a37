"""Shell metacharacters, newlines and path traversal never execute: a canary proves it.

Every value below would create ``tmp_path/CANARY`` if any shell ever parsed it (``$(...)``,
backticks, ``;``, ``|``, ``&&``, a redirect, a newline, ``${IFS}``, an ssh option). They go
where a user or a search space can put them (choice values that become flags and
environment variables, deployment arguments, environment and working directory, run
directories) and through the paths that start processes for real: :func:`render` +
:class:`LocalLauncher`, the :class:`ProcessManager` through :class:`LocalShell` (a real
``/bin/sh``, where quoting matters), the systemd drop-in under the stand-in ``systemctl``
(which parses unit files per systemd.syntax(7) and runs ``ExecStart=``), the systemd export
(checked by the real ``systemd-analyze verify``, then run by the stand-in), and the
paste-able ``command_line()`` through a real shell. The stand-in service writes its argv,
environment and working directory to JSON: each value must arrive verbatim and the canary
must not exist. Names that become file names, unit names, ssh arguments or directories are
refused up front instead: a ConfigError naming the file and the field.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_support import REPO

sys.path.insert(0, str(REPO / "tests" / "remote"))
sys.path.insert(0, str(REPO / "tests" / "remote" / "fake_systemd"))
from managers_support import (  # noqa: E402
    FakeSystemd,
    free_port,
    healthy,
    kill_groups,
    pidfile_pids,
    wait_until,
)
from systemd_verify import SYSTEMD_ANALYZE, verify  # noqa: E402

from autotune.deployment import load_deployment  # noqa: E402
from autotune.errors import ConfigError  # noqa: E402
from autotune.export.systemd import export_systemd  # noqa: E402
from autotune.launch.local import LocalLauncher  # noqa: E402
from autotune.remote.dropin import normalize_unit, render_dropin  # noqa: E402
from autotune.remote.managers import ProcessManager, SystemdManager  # noqa: E402
from autotune.remote.shell import LocalShell  # noqa: E402
from autotune.render import render  # noqa: E402
from autotune.results import ServiceRecord, TrialResult  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.specs import ServiceSpec  # noqa: E402

PY = os.path.abspath(sys.executable)
UNIT = "canary-svc.service"

DUMP_SERVICE = textwrap.dedent(
    """\
    # Stand-in server: records argv, environment and working directory, serves /health.
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    out, port = sys.argv[1], int(sys.argv[2])
    record = {"argv": sys.argv[3:], "env": dict(os.environ), "cwd": os.getcwd()}
    with open(out + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(out + ".tmp", out)

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
)


def payloads(canary: Path) -> list[str]:
    """Values that run ``touch CANARY`` (or create it by a redirect) if a shell parses them."""
    c = str(canary)
    return [
        f"$(touch {c})",
        f"`touch {c}`",
        f"; touch {c}",
        f"| touch {c}",
        f"&& touch {c}",
        f"> {c}",
        "'\"'",
        f"\n touch {c}",
        f"x\ntouch {c}\n",
        f"${{IFS}}touch${{IFS}}{c}",
        "../../../tmp/CANARY",
        f"-oProxyCommand=touch {c}",
        f"%n %% $$ $HOME \\ {c}",
        "*",
        "~",
        "",
    ]


def unit_safe(values: list[str]) -> list[str]:
    """The payloads a unit file can carry (a newline cannot be written into one)."""
    return [v for v in values if "\n" not in v]


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path/CANARY``; the tests run in ``tmp_path``, so a relative ``touch CANARY``
    (from a directory or file name, which cannot hold a '/') would create it too."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "CANARY"
    yield path
    assert not path.exists(), "a value was executed by a shell"


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    script = tmp_path / "dump_service.py"
    script.write_text(DUMP_SERVICE)
    return script


def read_dump(path: Path, *, timeout_s: float = 15.0) -> dict[str, Any]:
    assert wait_until(path.exists, timeout_s=timeout_s), f"the service never wrote {path}"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def hostile_dir(tmp_path: Path, canary: Path) -> Path:
    """A directory whose name is a command substitution (and has a space)."""
    path = tmp_path / f"work dir $(touch {canary.name})"
    path.mkdir()
    return path


# --------------------------------------------------------------------------- search space
def test_space_values_and_deployment_values_reach_a_local_service_verbatim(
    tmp_path: Path, canary: Path, dump: Path
) -> None:
    """Choice values (flag values, environment values, a map's flags and environment) and
    the deployment's own arguments, environment and working directory, through render() and
    the LocalLauncher: verbatim in the running service, never run."""
    values = payloads(canary)
    parameters: dict[str, Any] = {}
    for i, value in enumerate(values):
        parameters[f"flag{i}"] = {
            "type": "categorical",
            "choices": [value],
            "target": {"flag": f"--value-{i}"},
        }
        parameters[f"env{i}"] = {
            "type": "categorical",
            "choices": [value],
            "target": {"env": f"CANARY_ENV_{i}"},
        }
    parameters["mapped"] = {
        "type": "categorical",
        "choices": ["x"],
        "target": {"map": {"x": {"flags": {"--mapped": values[0]}, "env": {"MAPPED": values[1]}}}},
    }
    space_file = tmp_path / "canary-space.yaml"
    space_file.write_text(
        yaml.safe_dump(
            {
                "name": "canary",
                "services": ["svc"],
                "engine": {"name": "generic"},
                "parameters": parameters,
            }
        )
    )
    workdir = hostile_dir(tmp_path, canary)
    out = tmp_path / "svc.json"
    # In a deployment file "${...}" is a template: "$${IFS}" is how to write it literally.
    literal = [v.replace("${", "$${") for v in values]
    deployment_file = tmp_path / "canary-deployment.yaml"
    deployment_file.write_text(
        yaml.safe_dump(
            {
                "name": "canary",
                "endpoint": "http://${svc.host}:${svc.port}",
                "run_dir": str(tmp_path / f"runs $(touch {canary.name})"),
                "services": {
                    "svc": {
                        "command": ["${python}", str(dump), str(out), "${port}", *literal],
                        "env": {f"BASE_{i}": v for i, v in enumerate(literal)},
                        "workdir": str(workdir),
                        "port": "auto",
                        "health": {"url": "http://${host}:${port}/health", "timeout_s": 20},
                    }
                },
            }
        )
    )
    space = load_space(space_file)
    deployment = load_deployment(deployment_file)
    config = space.complete({name: spec["choices"][0] for name, spec in parameters.items()})
    run_dir = deployment.default_run_dir("study")
    specs = render(space, deployment, config, run_dir=run_dir)
    with LocalLauncher(run_dir=run_dir, stop_grace_s=2.0) as launcher:
        launcher.apply(specs)
        seen = read_dump(out)
        launcher.stop_all()
    argv = seen["argv"]
    assert argv[: len(values)] == values  # the deployment's own arguments, in order
    for i, value in enumerate(values):
        assert argv[argv.index(f"--value-{i}") + 1] == value
        assert seen["env"][f"CANARY_ENV_{i}"] == value
        assert seen["env"][f"BASE_{i}"] == value
    assert argv[argv.index("--mapped") + 1] == values[0]
    assert seen["env"]["MAPPED"] == values[1]
    assert seen["cwd"] == str(workdir)
    assert (run_dir / "svc.log").exists()  # the run directory is the literal name


def test_pasteable_command_line_survives_a_real_shell(tmp_path: Path, canary: Path) -> None:
    """``ServiceSpec.command_line()`` (stored with every trial, meant to be pasted into a
    shell) gives back exactly the argv and environment words when ``/bin/sh`` parses it."""
    values = payloads(canary)
    spec = ServiceSpec(
        name="svc",
        argv=(PY, "serve", *values),
        env={f"V{i}": v for i, v in enumerate(values)},
        unset_env=("NCCL_PROTO",),
        port=1,
        health_url="http://127.0.0.1:1/health",
        log_file=str(tmp_path / "svc.log"),
    )
    words = subprocess.run(
        ["/bin/sh", "-c", f"set -- {spec.command_line()}; printf '%s\\0' \"$@\""],
        capture_output=True,
        check=True,
        timeout=10,
    ).stdout.split(b"\0")[:-1]
    env_words = [f"V{i}={v}" for i, v in sorted(enumerate(values), key=lambda p: f"V{p[0]}")]
    assert [w.decode() for w in words] == [
        "env",
        "-u",
        "NCCL_PROTO",
        *env_words,
        PY,
        "serve",
        *values,
    ]


# --------------------------------------------------------------------------- remote managers
@pytest.fixture
def process_run_dir(tmp_path: Path, canary: Path) -> Iterator[Path]:
    path = tmp_path / f"run $(touch {canary.name}); touch {canary.name}"
    yield path
    kill_groups(pidfile_pids(path))


def test_process_manager_through_a_real_shell(
    tmp_path: Path, canary: Path, dump: Path, process_run_dir: Path
) -> None:
    """ProcessManager builds ``sh`` command lines (LocalShell runs them through /bin/sh):
    argv, environment, working directory and run directory arrive verbatim."""
    values = payloads(canary)
    port = free_port()
    out = tmp_path / "svc.json"
    workdir = hostile_dir(tmp_path, canary)
    spec = ServiceSpec(
        name="svc",
        argv=(PY, str(dump), str(out), str(port), *values),
        env={f"CANARY_ENV_{i}": v for i, v in enumerate(values)},
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        log_file=str(tmp_path / "unused.log"),
        workdir=str(workdir),
        manager="process",
    )
    mgr = ProcessManager(
        shell=LocalShell(), deployment="canary", run_dir=str(process_run_dir), stop_grace_s=2.0
    )
    mgr.start(spec)
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=15), mgr.log_tail("svc")
    seen = read_dump(out)
    assert seen["argv"] == values
    for i, value in enumerate(values):
        assert seen["env"][f"CANARY_ENV_{i}"] == value
    assert seen["cwd"] == str(workdir)
    assert (process_run_dir / "svc.pid").exists()
    assert mgr.inventory()["services"]["svc"]["alive"] is True
    mgr.restore("svc")
    assert not mgr.alive("svc")


@pytest.mark.parametrize(
    ("deployment", "service"),
    [
        ("canary", "svc; touch CANARY"),
        ("canary", "../svc"),
        ("canary", "-svc"),
        ("$(touch CANARY)", "svc"),
        ("../canary", "svc"),
    ],
)
def test_process_manager_refuses_names_that_become_file_names(
    tmp_path: Path, canary: Path, deployment: str, service: str
) -> None:
    """Deployment and service names become file names on the host: refused, not quoted."""
    with pytest.raises(ConfigError) as info:
        mgr = ProcessManager(shell=LocalShell(), deployment=deployment, run_dir=str(tmp_path))
        mgr.start(
            ServiceSpec(
                name=service,
                argv=(PY, "-c", "pass"),
                port=free_port(),
                health_url="http://127.0.0.1:1/health",
                log_file=str(tmp_path / "x.log"),
                manager="process",
            )
        )
    assert info.value.field in ("deployment", "services")
    assert not list(tmp_path.glob("*CANARY*"))


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeSystemd]:
    sd = FakeSystemd(tmp_path / "systemd")
    yield sd
    sd.cleanup()


def test_systemd_dropin_runs_the_values_verbatim(
    tmp_path: Path, canary: Path, dump: Path, fake: FakeSystemd
) -> None:
    """The drop-in's ``Environment=``/``ExecStart=`` quoting, as systemd parses it (the
    stand-in runs the merged unit; ``systemd-analyze verify`` checks the same files)."""
    values = unit_safe(payloads(canary))
    port = free_port()
    out = tmp_path / "svc.json"
    fake.write_unit(UNIT, [PY, "-c", "'import time; time.sleep(60)'"])
    assert fake.systemctl("daemon-reload").returncode == 0
    spec = ServiceSpec(
        name="svc",
        argv=(PY, str(dump), str(out), str(port), *values),
        env={f"CANARY_ENV_{i}": v for i, v in enumerate(values)},
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        log_file=str(tmp_path / "unused.log"),
        manager="systemd",
        unit=UNIT,
    )
    mgr = SystemdManager(
        shell=fake.shell,
        deployment="canary",
        run_dir=str(tmp_path / "run"),
        unit_dir=str(fake.unit_dir),
        sudo=False,
        stop_grace_s=2.0,
    )
    mgr.start(spec)
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=15), mgr.log_tail("svc")
    seen = read_dump(out)
    assert seen["argv"] == values
    for i, value in enumerate(values):
        assert seen["env"][f"CANARY_ENV_{i}"] == value
    if SYSTEMD_ANALYZE is not None:
        proc = verify(fake.unit_dir / UNIT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    mgr.restore("svc")


@pytest.mark.parametrize("where", ["argv", "env", "workdir"])
def test_systemd_dropin_refuses_a_newline(tmp_path: Path, canary: Path, where: str) -> None:
    """A newline would end the unit-file setting and start a new one: refused, naming the
    service, rather than written."""
    value = f"x\nExecStartPre=/bin/touch {canary}"
    spec = ServiceSpec(
        name="svc",
        argv=(PY, value) if where == "argv" else (PY,),
        env={"V": value} if where == "env" else {},
        workdir=f"/tmp/{value}" if where == "workdir" else None,
        port=1,
        health_url="http://127.0.0.1:1/health",
        log_file=str(tmp_path / "x.log"),
        manager="systemd",
        unit=UNIT,
    )
    with pytest.raises(ConfigError) as info:
        render_dropin(spec, executable=PY, deployment="canary", unit=UNIT)
    assert info.value.field is not None and info.value.field.startswith("services.svc")


@pytest.mark.parametrize(
    "unit",
    ["../../etc/x.service", "a/b.service", "-x.service", "x;touch CANARY", "x y", "x\n"],
)
def test_unit_names_that_are_not_unit_names_are_refused(unit: str) -> None:
    with pytest.raises(ConfigError) as info:
        normalize_unit(unit, service="svc")
    assert info.value.field == "services.svc.unit"


def test_systemd_export_units_run_the_values_verbatim(
    tmp_path: Path, canary: Path, dump: Path, fake: FakeSystemd
) -> None:
    """The exported unit passes ``systemd-analyze verify`` and, run as systemd would run it,
    gives the service exactly the trial's argv and environment; a newline is refused."""
    values = unit_safe(payloads(canary))
    port = free_port()
    out = tmp_path / "svc.json"
    record = ServiceRecord(
        argv=[PY, str(dump), str(out), str(port), *values],
        env={f"CANARY_ENV_{i}": v for i, v in enumerate(values)},
    )
    trial = TrialResult(number=7, state="COMPLETE", services={"svc": record})
    written = export_systemd(trial, out_dir=tmp_path / "export")
    unit_file = next(p for p in written if p.name == "autotune-svc.service")
    if SYSTEMD_ANALYZE is not None:
        proc = verify(unit_file)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.copy(unit_file, fake.unit_dir / unit_file.name)
    assert fake.systemctl("daemon-reload").returncode == 0
    started = fake.systemctl("start", unit_file.name)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        seen = read_dump(out)
        assert wait_until(lambda: healthy(f"http://127.0.0.1:{port}/health"), timeout_s=15)
    finally:
        fake.systemctl("stop", unit_file.name)
    assert seen["argv"] == values
    for i, value in enumerate(values):
        assert seen["env"][f"CANARY_ENV_{i}"] == value

    bad = ServiceRecord(argv=[PY, f"x\ntouch {canary}"])
    with pytest.raises(ConfigError, match="newline"):
        export_systemd(
            TrialResult(number=8, state="COMPLETE", services={"svc": bad}),
            out_dir=tmp_path / "bad",
        )


# --------------------------------------------------------------------------- refused up front
GOOD_DEPLOYMENT = {
    "name": "canary",
    "endpoint": "http://${svc.host}:${svc.port}",
    "hosts": {"gpu": {"address": "10.0.0.1", "user": "sglang"}},
    "services": {
        "svc": {
            "on": "gpu",
            "manager": "systemd",
            "unit": "sglang.service",
            "command": ["/opt/venv/bin/python", "-m", "server", "--port", "${port}"],
            "env": {"A": "1"},
            "port": 30000,
        }
    },
}


def _set(data: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    node: Any = data
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("services.svc.unit", "../../etc/evil.service", "services.svc.unit"),
        ("services.svc.unit", "a/b.service", "services.svc.unit"),
        ("services.svc.unit", "-evil.service", "services.svc.unit"),
        ("services.svc.unit", "x;touch CANARY", "services.svc.unit"),
        ("services.svc.env.A", "line\nExecStartPre=/bin/touch CANARY", "services.svc.env.A"),
        ("services.svc.command.1", "x\ntouch CANARY", "services.svc.command[1]"),
        ("hosts.gpu.address", "-oProxyCommand=touch CANARY", "hosts.gpu.address"),
        ("hosts.gpu.address", "h; touch CANARY", "hosts.gpu.address"),
        ("hosts.gpu.user", "-oProxyCommand=touch CANARY", "hosts.gpu.user"),
        ("hosts.gpu.user", "root; touch CANARY", "hosts.gpu.user"),
        ("hosts.gpu.key_file", "~/.ssh/id\nProxyCommand touch CANARY", "hosts.gpu.key_file"),
        ("hosts.gpu.systemd_unit_dir", "etc/systemd", "hosts.gpu.systemd_unit_dir"),
        ("services.svc.command.0", "/bin/sh\x00", "services.svc.command[0]"),
        ("services.svc.command.2", "${IFS}", "services.svc.command[2]"),
        ("name", "../canary", "name"),
    ],
)
def test_deployment_refuses_names_and_values_it_cannot_carry(
    tmp_path: Path, path: str, value: str, field: str
) -> None:
    """Unit names, host addresses and users, values a unit file cannot hold, NUL, unknown
    templates: a ConfigError naming the file and the field when the file is loaded."""
    data = _set(json.loads(json.dumps(GOOD_DEPLOYMENT)), path, value)
    file = tmp_path / "canary-deployment.yaml"
    file.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_deployment(file)
    assert info.value.file == str(file), str(info.value)
    assert info.value.field == field, str(info.value)
    assert "\n" not in str(info.value)


def test_good_deployment_loads(tmp_path: Path) -> None:
    """Control for the refusals above: the unmutated file is valid."""
    file = tmp_path / "canary-deployment.yaml"
    file.write_text(yaml.safe_dump(GOOD_DEPLOYMENT))
    assert load_deployment(file).services["svc"].unit == "sglang.service"


def test_search_space_value_with_a_newline_is_refused_for_a_systemd_service(
    tmp_path: Path,
) -> None:
    """A choice value that would reach a systemd drop-in with a newline is refused at render
    time, naming the deployment file and the service's setting."""
    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "services": ["svc"],
                "engine": {"name": "generic"},
                "parameters": {
                    "p": {"type": "categorical", "choices": ["a\nb"], "target": {"env": "P"}}
                },
            }
        )
    )
    file = tmp_path / "canary-deployment.yaml"
    file.write_text(yaml.safe_dump(GOOD_DEPLOYMENT))
    space = load_space(space_file)
    with pytest.raises(ConfigError) as info:
        render(space, load_deployment(file), {"p": "a\nb"}, run_dir=tmp_path / "run")
    assert info.value.file == str(file)
    assert info.value.field == "services.svc.env.P"


@pytest.mark.parametrize("study", ["../x", "a/b", "/abs", "..", "$(touch CANARY)", "-x"])
def test_study_names_that_are_not_file_names_are_refused(study: str) -> None:
    from autotune.study.storage import check_study_name, default_storage_url

    with pytest.raises(ConfigError) as info:
        check_study_name(study)
    assert info.value.field == "--study"
    with pytest.raises(ConfigError):
        default_storage_url(study)
    dep = load_deployment(REPO / "launchers" / "sim-dsv4-flash-pd.yaml")
    if "/" in study or study == "..":
        with pytest.raises(ConfigError):
            dep.default_run_dir(study)


def test_study_name_with_a_trailing_newline_is_refused() -> None:
    from autotune.study.storage import check_study_name

    with pytest.raises(ConfigError):
        check_study_name("study\n")
