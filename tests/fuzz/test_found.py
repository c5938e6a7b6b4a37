"""What the fuzzers found, pinned: each input used to end in a traceback, a hang, a
multi-line message or silent acceptance; now it is one ConfigError naming file and field.

"""

from __future__ import annotations

import io
import os
import textwrap
from pathlib import Path

import pytest
from fuzz_support import REPO

from autotune.deployment import load_deployment
from autotune.errors import ConfigError
from autotune.space import load_space
from autotune.study.definition import load_study_definition
from autotune.yamlio import read_yaml

SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
SIM = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"

DEPLOYMENT = """\
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


def _error(tmp_path: Path, text: str, load: object = load_deployment) -> ConfigError:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)  # type: ignore[operator]
    assert info.value.file == str(path), str(info.value)
    assert "\n" not in str(info.value), str(info.value)
    return info.value


# --------------------------------------------------------------------------- reading YAML
def test_control_character_in_the_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"name: x\nservices: \x13\n")
    with pytest.raises(ConfigError, match=r"line 2: character '\\x13' is not allowed") as info:
        read_yaml(path)
    assert "\n" not in str(info.value)


def test_nul_in_a_value_is_refused_with_its_field(tmp_path: Path) -> None:
    """A NUL can be written in YAML ("\\0") but no argv, environment or path can carry it
    (Popen raised ValueError at launch time)."""
    err = _error(tmp_path, DEPLOYMENT.replace("--bind,", '"--bi\\0nd",'))
    assert err.field == "services.worker.command[3]" and "NUL" in err.message


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "dir"])
def test_only_regular_files_are_read(tmp_path: Path, special: str) -> None:
    """/dev/zero was read until memory ran out and a FIFO blocked forever."""
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif special == "dir":
        path = tmp_path
    with pytest.raises(ConfigError, match="cannot read the file"):
        read_yaml(path)


def test_nul_in_the_path_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_space("search_spaces/a\x00b.yaml")


def test_odd_keys_stay_on_one_line(tmp_path: Path) -> None:
    err = _error(tmp_path, DEPLOYMENT + '"a\\nb": 1\n')
    assert err.field == "['a\\nb']" and err.allowed and "endpoint" in err.allowed


# --------------------------------------------------------------------------- deployments
def test_port_auto_on_a_host_of_another_machine(tmp_path: Path) -> None:
    """port: auto binds a socket on ``host``: an address of another machine raised OSError
    from Deployment.ports() (that is, from render, at the first trial)."""
    path = tmp_path / "d.yaml"
    path.write_text(DEPLOYMENT.replace("    port: auto", "    port: auto\n    host: 192.0.2.1"))
    dep = load_deployment(path)
    with pytest.raises(ConfigError) as info:
        dep.ports()
    assert info.value.file == str(path) and info.value.field == "services.worker.port"


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("  worker:\n", '  "worker\\n":\n', "services"),  # re.match + '$' took the newline
        ("name: tiny", "name: tiny\nhosts: {'0 gpu': {address: h}}", "hosts"),
        ("endpoint: http://", "endpoint: http://[::1", "endpoint"),
        ("port: 18000", "port: 18000\n    health: {url: 'ftp://x'}", "services.router.health.url"),
    ],
)
def test_deployment_fields_found_by_the_fuzz(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    assert old in DEPLOYMENT
    err = _error(tmp_path, DEPLOYMENT.replace(old, new, 1))
    assert err.field == field, str(err)


def test_one_translator_keeps_host_values_out_of_messages(tmp_path: Path) -> None:
    """HostSpec hides its inputs (a value there might be a secret put in the wrong field):
    the shared pydantic translation honours that for deployments and ``parse_hosts``."""
    from autotune.remote.hosts import parse_hosts

    text = DEPLOYMENT.replace("name: tiny", "name: tiny\nhosts: {a: {address: h, port: hunter2}}")
    err = _error(tmp_path, text)
    assert err.field == "hosts.a.port" and "hunter2" not in str(err)
    with pytest.raises(ConfigError) as info:
        parse_hosts({"a": {"address": "h", "sudo": "hunter2"}}, file="d.yaml")
    assert info.value.field == "hosts.a.sudo" and "hunter2" not in str(info.value)
    assert info.value.allowed == ["auto", "always", "never"]


def test_unknown_host_without_hosts_explains_instead_of_an_empty_list(tmp_path: Path) -> None:
    err = _error(tmp_path, DEPLOYMENT.replace("    port: 18000", "    port: 18000\n    on: gpu"))
    assert err.field == "services.router.on" and "has no `hosts:`" in err.message
    assert "(allowed: )" not in str(err)


def test_study_names_cannot_leave_the_run_directory() -> None:
    dep = load_deployment(SIM)
    assert dep.default_run_dir("s1").name == "s1"
    for bad in ("../x", "a/b", "..", "x\n"):
        with pytest.raises(ConfigError, match="study name"):
            dep.default_run_dir(bad)


# --------------------------------------------------------------------------- search spaces
@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("name: dsv4-flash-rtx6000-pd", 'name: "dsv4\\n"', "name"),
        ("services: [prefill, decode]", 'services: ["prefill\\n", decode]', "services[0]"),
        ("env: NCCL_PROTO", 'env: "NCCL_PROTO\\n"', "parameters.nccl_proto.target.env"),
    ],
)
def test_space_names_with_a_trailing_newline(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    text = SPACE.read_text()
    assert old in text
    err = _error(tmp_path, text.replace(old, new, 1), load=load_space)
    assert err.field == field


# --------------------------------------------------------------------------- study files
STUDY = f"""\
name: s
space: {SPACE}
deployment: {SIM}
"""


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("load: {duration_s: 300}", "load.duration_s"),  # > max_duration_s: LoadSpec crashed
        ("load: {requests: null}", "load.requests"),  # no stop rule: LoadSpec crashed
        ("seed: 4294967296", "seed"),  # numpy refused it inside make_sampler
        ("seed: -1", "seed"),
        ("load: {max_duration_s: .inf}", "load.max_duration_s"),
        ("slo: {tpot_p99_ms: .nan}", "slo.tpot_p99_ms"),
        ("trial_timeout_s: .inf", "trial_timeout_s"),
        ("load: {input_len: 1000000000000}", "load.input_len"),
        ("load: {warmup_requests: 100000000000}", "load.warmup_requests"),
    ],
)
def test_study_values_the_tuner_could_not_use(tmp_path: Path, extra: str, field: str) -> None:
    err = _error(tmp_path, STUDY + extra + "\n", load=load_study_definition)
    assert err.field == field, str(err)


@pytest.mark.parametrize(
    ("line", "field"),
    [("space: ''", "space"), ("deployment: no-such-file.yaml", "deployment")],
)
def test_study_paths_are_checked_with_the_study_file(tmp_path: Path, line: str, field: str) -> None:
    key = line.split(":", 1)[0]
    text = "\n".join(ln if not ln.startswith(key + ":") else line for ln in STUDY.splitlines())
    err = _error(tmp_path, text + "\n", load=load_study_definition)
    assert err.field == field, str(err)


# --------------------------------------------------------------------------- elsewhere
def test_progress_prints_text_not_markup() -> None:
    from rich.console import Console

    from autotune.study.progress import RichProgress

    progress = RichProgress(console=Console(file=io.StringIO(), force_terminal=True))
    try:
        progress.message("storage sqlite:///[/]study.db")
    finally:
        progress.close()


def test_bench_table_prints_server_errors_as_text() -> None:
    from rich.console import Console

    from autotune.loadgen.display import metrics_table
    from autotune.loadgen.metrics import compute_metrics
    from autotune.loadgen.records import RequestRecord

    ok = RequestRecord(index=0, send_time=0.0, end_time=1.0, chunk_times=[0.5], text="x")
    bad = RequestRecord(index=1, send_time=0.0, end_time=1.0, error="HTTP 500: [/]oops")
    table = metrics_table(compute_metrics([ok, bad], duration_s=1.0))
    Console(file=io.StringIO()).print(table)


def test_empty_allowed_list_is_not_printed() -> None:
    assert "(allowed: )" not in str(ConfigError("no other host", field="hosts.a.jump", allowed=[]))


def test_multiline_message_is_one_line_in_the_cli() -> None:
    """Whatever an error quotes, the CLI prints one line (control characters escaped)."""
    from typer.testing import CliRunner

    from autotune.cli import app

    result = CliRunner().invoke(app, ["space", "check", "a\nb.yaml"])
    assert result.exit_code == 2
    assert result.output.strip() == textwrap.dedent(
        "error: a\\nb.yaml: cannot read the file: No such file or directory"
    )
