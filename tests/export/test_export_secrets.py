"""Exports of a trial whose services had credentials: no format prints them, all still work.

The study holds ``<redacted>`` (or, for a study written before redaction, the real value:
``old_study``). ``env``/``command`` must reference the variables and really pass the values
a shell holds; ``systemd`` must put them in an owner-only ``EnvironmentFile=`` that a unit
reads, checked with the real ``systemd-analyze verify`` and by starting the ``ExecStart=``
the way systemd would (words and ``${VAR}`` substitution by the remote tests' systemd
stand-in, the environment file by a parser written from systemd.exec(5) below).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_results import TrialSpec, make_study, record
from systemd_verify import SYSTEMD_ANALYZE, verify

from autotune.export import export, export_command, export_env, export_json, export_systemd
from autotune.export.credentials import PLACEHOLDER
from autotune.results import TrialResult, load_results
from autotune.secrets import REDACTED, redact
from autotune.specs import ServiceSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "remote" / "fake_systemd"))
from _fakesd import expand_exec, specifiers, split_words  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

BASH = shutil.which("bash")
PY = os.path.abspath(sys.executable)
TOKEN = "hf_CANARYexport11"
KEY = "sk-CANARY 'quoted' $x"
KEY2 = "sk-CANARYsecond22"
PRINTER = (
    "import json, os, sys; "
    "print(json.dumps([sys.argv[1:], os.environ.get('HF_TOKEN'), os.environ.get('PLAIN')]))"
)
ARGV = [PY, "-c", PRINTER, "--api-key", KEY, "--port", "1", f"--admin-api-key={KEY2}"]
ENV = {"HF_TOKEN": TOKEN, "PLAIN": "visible value"}
CANARIES = (TOKEN, KEY, KEY2, "CANARY")


def _trial(tmp_path: Path, *, old_study: bool) -> TrialResult:
    rec = record(list(ARGV), dict(ENV), ["NCCL_PROTO"])
    if not old_study:
        rec = redact(rec, environ={})  # what autotune.study.record stores
        assert TOKEN not in json.dumps(rec)
    study = make_study(tmp_path / "db", [TrialSpec(services={"worker": rec})])
    return load_results(study)[0]


def _current() -> dict[str, ServiceSpec]:
    """The deployment as rendered now: where the systemd export takes the real values."""
    spec = ServiceSpec(
        name="worker", argv=tuple(ARGV), env=dict(ENV), port=1, health_url="h", log_file="l"
    )
    return {"worker": spec}


def _run_bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert BASH is not None
    return subprocess.run([BASH, "-c", script], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(BASH is None, reason="bash not installed")
@pytest.mark.parametrize("old_study", [False, True])
def test_text_exports_reference_secrets_and_still_run(tmp_path: Path, old_study: bool) -> None:
    trial = _trial(tmp_path, old_study=old_study)
    if old_study:  # control: the stored record really holds the values
        assert trial.services["worker"].env["HF_TOKEN"] == TOKEN
    texts = {
        "env": export(trial, fmt="env", out_dir=None),
        "command": export(trial, fmt="command", out_dir=None),
        "json": export(trial, fmt="json", out_dir=None),
    }
    for name, text in texts.items():
        assert isinstance(text, str)
        assert not [c for c in CANARIES if c in text], (name, text)
    command = [ln for ln in str(texts["command"]).splitlines() if not ln.startswith("#")][0]
    assert '"${HF_TOKEN:?' in command and '"${AUTOTUNE_SECRET_API_KEY:?' in command
    assert '--admin-api-key="${AUTOTUNE_SECRET_ADMIN_API_KEY:?' in command
    assert REDACTED not in command  # a pasted line never passes "<redacted>" to a server

    # The pasted line gets the values from the shell, exactly, quoting and all.
    env = {
        **os.environ,
        "HF_TOKEN": TOKEN,
        "AUTOTUNE_SECRET_API_KEY": KEY,
        "AUTOTUNE_SECRET_ADMIN_API_KEY": KEY2,
    }
    proc = _run_bash(command, env)
    assert proc.returncode == 0, proc.stderr
    argv, token, plain = json.loads(proc.stdout)
    assert argv == ["--api-key", KEY, "--port", "1", f"--admin-api-key={KEY2}"]
    assert token == TOKEN and plain == "visible value"
    # Unset: the shell refuses loudly instead of starting a server with a blank key.
    del env["AUTOTUNE_SECRET_API_KEY"]
    failed = _run_bash(command, env)
    assert failed.returncode != 0 and "AUTOTUNE_SECRET_API_KEY" in failed.stderr
    assert "is a secret autotune does not store" in failed.stderr

    # The env export exports the shell's value and names the flag's variable.
    script = str(texts["env"]) + '\nprintf "%s|%s" "$HF_TOKEN" "$PLAIN"'
    sourced = _run_bash(script, {**os.environ, "HF_TOKEN": TOKEN})
    assert sourced.returncode == 0 and sourced.stdout == f"{TOKEN}|visible value"
    assert "AUTOTUNE_SECRET_API_KEY" in str(texts["env"])

    doc = json.loads(str(texts["json"]))
    worker = doc["services"]["worker"]
    assert worker["env"]["HF_TOKEN"] == REDACTED and worker["env"]["PLAIN"] == "visible value"
    assert worker["argv"][4] == REDACTED
    assert worker["secrets"] == {
        "HF_TOKEN": "environment variable",
        "AUTOTUNE_SECRET_API_KEY": "value of --api-key",
        "AUTOTUNE_SECRET_ADMIN_API_KEY": "value of --admin-api-key",
    }
    # The library functions redact on their own too, not only through export().
    for direct in (export_env(trial), export_command(trial), export_json(trial)):
        assert not [c for c in CANARIES if c in direct]


def test_trial_without_secrets_exports_unchanged(tmp_path: Path) -> None:
    rec = record([PY, "-c", "pass", "--port", "1"], {"PLAIN": "x"}, [])
    trial = load_results(make_study(tmp_path / "db", [TrialSpec(services={"w": rec})]))[0]
    assert export_command(trial).splitlines()[-1] == rec["command"]
    assert "${" not in export_env(trial)
    export_systemd(trial, out_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "secrets").exists()
    assert "EnvironmentFile" not in (tmp_path / "out" / "units" / "autotune-w.service").read_text()


# ------------------------------------------------------------------ systemd
def parse_environment_file(text: str) -> dict[str, str]:
    """EnvironmentFile= as systemd.exec(5) describes it: ``KEY=VALUE`` lines, ``#``/``;``
    comments; single quotes literal; double quotes with ``\\`` before ``" \\ ` $`` escaped."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()), line
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1]
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r'\\([\\"`$])', r"\1", value[1:-1])
        env[key.strip()] = value
    return env


def start_like_systemd(unit_text: str, env_file: Path, unit: str) -> list[str]:
    """Run the unit's ExecStart= as systemd would: its Environment= lines, then the file."""
    env = {"PATH": os.environ.get("PATH", "")}
    for line in unit_text.splitlines():
        if line.startswith("Environment="):
            for word in split_words(line.split("=", 1)[1]):
                name, _, value = word.partition("=")
                env[name] = specifiers(value, unit)
        if line.startswith("EnvironmentFile="):
            assert line.split("=", 1)[1].endswith(env_file.name)
    env.update(parse_environment_file(env_file.read_text()))
    (exec_start,) = [ln.split("=", 1)[1] for ln in unit_text.splitlines() if ln.startswith(
        "ExecStart=") and ln != "ExecStart="]  # fmt: skip
    argv = expand_exec([specifiers(w, unit) for w in split_words(exec_start)], env)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True)
    return list(json.loads(out.stdout))


@pytest.mark.parametrize("old_study", [False, True])
def test_systemd_units_read_secrets_from_an_owner_only_file(
    tmp_path: Path, old_study: bool
) -> None:
    trial = _trial(tmp_path, old_study=old_study)
    notes: list[str] = []
    out = tmp_path / "out"
    written = export(trial, fmt="systemd", out_dir=out, current=_current(), notes=notes.append)
    assert isinstance(written, list)
    secret = out / "secrets" / "autotune-worker.env"
    assert secret in written and not notes
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    values = parse_environment_file(secret.read_text())
    assert values == {
        "HF_TOKEN": TOKEN,
        "AUTOTUNE_SECRET_API_KEY": KEY,
        "AUTOTUNE_SECRET_ADMIN_API_KEY": KEY2,
    }
    for path in written:
        if path != secret:
            text = path.read_text()
            assert not [c for c in CANARIES if c in text], path
    unit = (out / "units" / "autotune-worker.service").read_text()
    assert "EnvironmentFile=/etc/autotune/autotune-worker.env" in unit.splitlines()
    assert 'Environment="PLAIN=visible value"' in unit and 'Environment="HF_TOKEN' not in unit
    assert " --api-key ${AUTOTUNE_SECRET_API_KEY} " in unit
    # Started the way systemd starts it, the server gets the real values.
    argv, token, plain = start_like_systemd(unit, secret, "autotune-worker.service")
    assert argv == ["--api-key", KEY, "--port", "1", f"--admin-api-key={KEY2}"]
    assert token == TOKEN and plain == "visible value"
    dropin = out / "dropins" / "autotune-worker.service.d" / "50-autotune.conf"
    assert start_like_systemd(dropin.read_text(), secret, "autotune-worker.service")[1] == TOKEN


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_units_with_an_environment_file_verify_cleanly(tmp_path: Path) -> None:
    trial = _trial(tmp_path, old_study=False)
    export_systemd(trial, out_dir=tmp_path / "out", current=_current())
    unit = tmp_path / "out" / "units" / "autotune-worker.service"
    proc = verify(unit)
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr
    # The drop-in merged into an existing unit verifies too.
    etc = tmp_path / "etc"
    (etc / "autotune-worker.service.d").mkdir(parents=True)
    shutil.copy(
        tmp_path / "out" / "dropins" / "autotune-worker.service.d" / "50-autotune.conf",
        etc / "autotune-worker.service.d" / "50-autotune.conf",
    )
    base = etc / "autotune-worker.service"
    base.write_text(f"[Service]\nExecStart={PY} -m old\n\n[Install]\nWantedBy=multi-user.target\n")
    proc = verify(base)
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr
    # Control: a setting verify rejects in the same place is caught (the file is read).
    bad = unit.read_text().replace("EnvironmentFile=/etc/", "EnvironmentFile=etc/")
    unit.write_text(bad)
    assert verify(unit).returncode != 0


def test_unknown_secrets_are_placeholders_install_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # known from the environment ...
    monkeypatch.delenv("AUTOTUNE_SECRET_API_KEY", raising=False)  # ... these two are not
    monkeypatch.delenv("AUTOTUNE_SECRET_ADMIN_API_KEY", raising=False)
    trial = _trial(tmp_path, old_study=True)  # even a stored real value is not used
    notes: list[str] = []
    out = tmp_path / "out"
    export(trial, fmt="systemd", out_dir=out, notes=notes.append)
    secret = out / "secrets" / "autotune-worker.env"
    values = parse_environment_file(secret.read_text())
    assert values == {
        "HF_TOKEN": TOKEN,
        "AUTOTUNE_SECRET_API_KEY": PLACEHOLDER,
        "AUTOTUNE_SECRET_ADMIN_API_KEY": PLACEHOLDER,
    }
    assert len(notes) == 2 and all(str(secret) in n for n in notes), notes
    assert "AUTOTUNE_SECRET_API_KEY" in notes[0]
    assert "secrets/autotune-worker.env" in (out / "README.txt").read_text()

    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = {
        **os.environ,
        "UNIT_DIR": str(tmp_path / "units"),
        "SECRETS_DIR": str(tmp_path / "etc-autotune"),
        "SYSTEMCTL": str(fake),
    }
    script = [str(out / "install.sh")]
    refused = subprocess.run(script, env=env, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "fill in the secrets" in refused.stderr
    assert not (tmp_path / "units").exists() and not (tmp_path / "etc-autotune").exists()

    secret.write_text(secret.read_text().replace(PLACEHOLDER, "sk-filled-by-hand"))
    done = subprocess.run(script, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    installed = tmp_path / "etc-autotune" / "autotune-worker.env"
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600
    assert stat.S_IMODE(installed.parent.stat().st_mode) == 0o700
    assert parse_environment_file(installed.read_text())["AUTOTUNE_SECRET_API_KEY"] == (
        "sk-filled-by-hand"
    )
