"""autotune.secrets and the choke points that use it: record, progress, the local launcher.

Every test plants a canary and first shows it is present where it came from (so the
assertion that it is gone could fail), then that nothing autotune stores or shows has it.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shlex
import stat
import sys
import time
from pathlib import Path

import httpx
import optuna
import yaml

from autotune.engines import available_manifests, load_manifest
from autotune.launch import LocalLauncher
from autotune.ports import pick_free_port
from autotune.secrets import (
    REDACTED,
    is_secret_flag,
    looks_secret,
    redact,
    redact_argv,
    redacted_command,
    scrub_text,
    secret_values,
)
from autotune.specs import ServiceSpec
from autotune.study.progress import PlainProgress, TrialReport
from autotune.study.record import fail_trial, finish_trial
from autotune.trial.record import LOG_TAIL_CHARS, TrialOutcome, TrialRecord

REPO = Path(__file__).resolve().parents[2]
TOKEN = "hf_CANARYred4ct10n"
KEY = "sk-CANARYr3dact3d"
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAACANARYbm9uZQAAAARub25lAAAAAAAAAAEAAAAzAAAAC3NzaC1lZD\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
PEM_BODY = PEM.splitlines()[1]


def _service(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    spec = ServiceSpec(
        name="decode", argv=tuple(argv), env=env, port=1, health_url="h", log_file="l"
    )
    return {
        "command": spec.command_line(),
        "argv": list(spec.argv),
        "env": dict(spec.env),
        "unset_env": [],
    }


def _attrs() -> dict[str, object]:
    """A trial's attributes as the loop builds them, credentials everywhere they can be."""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--api-key", KEY]
    return {
        "config": {"mem_fraction_static": 0.8, "cuda_graph_max_bs": 256},
        "services": {
            "decode": _service(argv, {"HF_TOKEN": TOKEN, "NCCL_PROTO": "LL"}),
            "router": _service(["router", f"--admin-api-key={KEY}", "--port", "8"], {}),
        },
        "effective": {
            "decode": {
                "api_key": KEY,
                "admin_api_key": None,
                "tokenizer_path": "/m",
                "max_total_tokens": 4096,
            }
        },
        "reason": f"decode: exited with code 1: bad key {KEY}",
        "log_tail": (
            f"server_args=ServerArgs(model_path='/m', api_key='{KEY}', hf_token='{TOKEN}')\n"
            f"{PEM}\nstorage postgresql://tuner:pw-CANARY9@db/optuna\n"
        ),
        "metrics": {"output_throughput": 123.4, "completed": 8},
        "overrides": ["mem_fraction_static: 0.95 -> 0.9"],
    }


def _canaries(blob: str) -> list[str]:
    return [c for c in (TOKEN, KEY, "CANARY", PEM_BODY[:24]) if c in blob]


# ------------------------------------------------------------------ names
def test_secret_names_by_word_not_substring() -> None:
    secret = [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "OPENAI_API_KEY",
        "aws_secret_access_key",
        "DB_PASSWORD",
        "PGPASSWORD",
        "MY_PASSWD",
        "GITHUB_PAT",
        "apiKey",
        "api_key",
        "admin_api_key",
        "ssl_keyfile_password",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "API_KEYS",
    ]
    public = [
        "TOKENIZERS_PARALLELISM",
        "max_total_tokens",
        "eos_token_id",
        "tokenizer_path",
        "skip_tokenizer_init",
        "key_file",
        "ssl_keyfile",
        "HF_TOKEN_PATH",
        "SSH_AUTH_SOCK",
        "NCCL_PROTO",
        "CUDA_VISIBLE_DEVICES",
        "PATH",
        "PWD",
        "bucket_time_to_first_token",
        "speculative_token_map",
    ]
    assert [n for n in secret if not looks_secret(n)] == []
    assert [n for n in public if looks_secret(n)] == []
    for flag in ("--api-key", "--admin-api-key", "--hf-token", "--token", "--password"):
        assert is_secret_flag(flag), flag
    assert not is_secret_flag("--api-key=x") and not is_secret_flag("api-key")


def test_no_bundled_setting_looks_secret() -> None:
    """The bundled deployments and spaces: nothing is a secret; every engine's real
    options: only those that carry a credential (a false positive would blank a real setting
    in the study and the exports)."""
    names: set[str] = set()
    for path in [*REPO.glob("launchers/*.yaml"), *REPO.glob("search_spaces/*.yaml")]:
        text = path.read_text()
        yaml.safe_load(text)
        names |= set(re.findall(r"\b[A-Z][A-Z0-9_]{3,}\b", text))
        names |= set(re.findall(r"--[a-z0-9][a-z0-9-]+", text))
    assert len(names) > 60  # control: the files were read
    assert sorted(n for n in names if looks_secret(n.lstrip("-"))) == []
    flags = {
        f
        for engine, versions in available_manifests().items()
        for version in versions
        for f in load_manifest(engine, version).flags
    }
    assert len(flags) > 800  # control: every manifest was read
    assert sorted(f for f in flags if looks_secret(f.lstrip("-"))) == [
        "--admin-api-key",
        "--api-key",
        "--control-plane-api-keys",
        "--hf-token",
        "--oracle-password",
        "--ssl-keyfile-password",
    ]


# ------------------------------------------------------------------ redact
def test_redact_a_trial_everywhere_and_nothing_else() -> None:
    attrs = _attrs()
    before = copy.deepcopy(attrs)
    assert _canaries(json.dumps(attrs))  # control
    out = redact(attrs, environ={})
    assert attrs == before  # a copy; the input is untouched
    blob = json.dumps(out)
    assert _canaries(blob) == [], blob
    decode = out["services"]["decode"]  # type: ignore[index]
    assert decode["env"] == {"HF_TOKEN": REDACTED, "NCCL_PROTO": "LL"}
    assert decode["argv"][-2:] == ["--api-key", REDACTED]
    assert shlex.split(decode["command"])[-2:] == ["--api-key", REDACTED]
    assert "'HF_TOKEN=<redacted>'" in decode["command"] and "NCCL_PROTO=LL" in decode["command"]
    router = out["services"]["router"]  # type: ignore[index]
    assert router["argv"] == ["router", "--admin-api-key=<redacted>", "--port", "8"]
    eff = out["effective"]["decode"]  # type: ignore[index]
    assert eff == {
        "api_key": REDACTED,
        "admin_api_key": None,
        "tokenizer_path": "/m",
        "max_total_tokens": 4096,
    }
    assert out["reason"] == f"decode: exited with code 1: bad key {REDACTED}"
    tail = out["log_tail"]
    assert isinstance(tail, str)  # the log tail, as stored
    assert f"api_key='{REDACTED}', hf_token='{REDACTED}'" in tail
    assert "postgresql://tuner:<redacted>@db/optuna" in tail and "PRIVATE KEY" not in tail
    assert out["metrics"] == attrs["metrics"] and out["config"] == attrs["config"]
    assert out["overrides"] == attrs["overrides"]
    assert redact((1, "x", None), environ={}) == (1, "x", None)  # tuples stay tuples


def test_secrets_inside_text_quoting_and_cut_tails() -> None:
    odd = "hf_CANARY'quoted $x"
    command = shlex.join(["env", f"HF_TOKEN={odd}", "srv"])
    assert odd not in command  # shlex spells it differently: a plain replace would miss it
    out = redact({"env": {"HF_TOKEN": odd}, "argv": ["srv"], "command": command}, environ={})
    assert "CANARY" not in json.dumps(out)
    # Values only spelled in text are found by their name there.
    texts = [
        f"HF_TOKEN={TOKEN} python -m x",
        f'{{"api_key": "{KEY}"}}',
        f"run --api-key {KEY} --port 1",
        f"export OPENAI_API_KEY='{KEY}'",
    ]
    for text in texts:
        assert "CANARY" not in scrub_text(text, environ={}), text
    # A log tail cut inside a secret: the fragment at either edge goes too.
    assert scrub_text(KEY[5:] + " rest", extra=[KEY], environ={}) == f"{REDACTED} rest"
    assert scrub_text("start " + KEY[:9], extra=[KEY], environ={}) == f"start {REDACTED}"
    # A truncated PEM block (no END, or no BEGIN) is still removed.
    assert PEM_BODY not in scrub_text("x\n" + PEM.rsplit("\n", 1)[0], environ={})
    assert PEM_BODY not in scrub_text(PEM.split("\n", 1)[1] + "\nafter", environ={})
    # Prose about a flag is not a secret; short values are not scrubbed from text.
    assert scrub_text("--api-key must be set", environ={}) == "--api-key must be set"
    assert secret_values({"API_KEY": "1"}, environ={}) == set()
    assert redact({"API_KEY": "1", "n": "1 2 1"}, environ={}) == {"API_KEY": REDACTED, "n": "1 2 1"}


def test_autotunes_own_environment_secrets_are_scrubbed() -> None:
    """A locally started server inherits the tuner's HF_TOKEN and may print it."""
    log = f"loading with token {TOKEN}"
    assert scrub_text(log, environ={}) == log  # control: unknown without the environment
    assert scrub_text(log, environ={"HF_TOKEN": TOKEN}) == f"loading with token {REDACTED}"


def test_redacted_command_matches_servicespec_spelling() -> None:
    spec = ServiceSpec(
        name="s",
        argv=("srv", "--port", "1"),
        env={"B": "x y", "A": "1"},
        unset_env=("Z",),
        port=1,
        health_url="h",
        log_file="l",
    )
    assert redacted_command(spec.argv, spec.env, spec.unset_env) == spec.command_line()
    assert redact_argv(["srv", "--api-key", "--port", "1"]) == ["srv", "--api-key", "--port", "1"]


# ------------------------------------------------------------------ record
def _study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(study_name="r", storage=f"sqlite:///{tmp_path / 'r.db'}")


def test_finish_trial_stores_only_redacted_attributes(tmp_path: Path) -> None:
    study = _study(tmp_path)
    trial = study.ask()
    attrs = _attrs()
    # A long tail whose cut at LOG_TAIL_CHARS falls inside the secret.
    cut = f"key {KEY} " + "x" * (LOG_TAIL_CHARS - len(KEY) // 2 - 1)
    attrs["log_tail"] = str(attrs["log_tail"]) + cut
    outcome = TrialOutcome(
        values=[1.0], constraints={"feasible": 0.0}, record=TrialRecord.from_attrs(attrs)
    )
    finish_trial(study, trial, outcome, constraint_keys=["feasible"])
    stored = study.trials[0].user_attrs
    assert _canaries(json.dumps(stored)) == [], stored
    assert stored["services"]["decode"]["env"]["HF_TOKEN"] == REDACTED
    assert len(stored["log_tail"]) == LOG_TAIL_CHARS
    assert outcome.attrs["reason"] == stored["reason"]  # what the loop shows next
    assert not _canaries((tmp_path / "r.db").read_bytes().decode(errors="replace"))


def test_fail_trial_redacts_its_reason(tmp_path: Path) -> None:
    study = _study(tmp_path)
    trial = study.ask()
    fail_trial(
        study,
        trial,
        failure="host_unreachable",
        reason=f"gpu1: ssh failed running env HF_TOKEN={TOKEN} ... and {KEY}",
        secrets=[KEY],
    )
    reason = study.trials[0].user_attrs["reason"]
    assert _canaries(reason) == [] and reason.startswith("gpu1: ssh failed")
    # Control: a bare value with no secret-looking name is only found when passed in.
    other = study.ask()
    fail_trial(study, other, failure="host_unreachable", reason=f"bad {KEY}")
    assert study.trials[1].user_attrs["reason"] == f"bad {KEY}"


# ------------------------------------------------------------------ progress
def test_progress_lines_are_scrubbed() -> None:
    stream = io.StringIO()
    progress = PlainProgress(stream)
    progress.message(f"study 'x' on postgresql://u:pw-CANARY1@h/db: started with {TOKEN}")
    progress.trial_started(number=3, index=1, total=2, config={})
    report = TrialReport(
        number=3,
        throughput=None,
        failure="exited",
        reason=f"decode: --api-key={KEY} rejected",
        best=None,
        best_number=None,
        seconds=1.0,
        reused_from=None,
    )
    progress.trial_finished(report)
    text = stream.getvalue()
    assert "infeasible [exited] decode: --api-key=<redacted> rejected" in text
    assert "postgresql://u:<redacted>@h/db" in text
    assert "CANARY" not in text.replace(TOKEN, "") and "pw-CANARY1" not in text
    assert TOKEN in text  # control: a bare value with no name is only found when known
    progress.message(f"HF_TOKEN={TOKEN}")
    assert stream.getvalue().count(TOKEN) == 1


# ------------------------------------------------------------------ local launcher
PRINT_ENV = (
    "import os, sys, http.server as h; "
    "print('token=' + os.environ.get('HF_TOKEN', '-'), flush=True); "
    "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), h.SimpleHTTPRequestHandler).serve_forever()"
)


def test_local_launcher_logs_redacted_commands(tmp_path: Path) -> None:
    port = pick_free_port()
    log = tmp_path / "svc.log"
    spec = ServiceSpec(
        name="svc",
        argv=(sys.executable, "-c", PRINT_ENV, str(port), "--api-key", KEY),
        env={"HF_TOKEN": TOKEN},
        port=port,
        health_url=f"http://127.0.0.1:{port}/",
        log_file=str(log),
        ready_timeout_s=20,
    )
    launcher = LocalLauncher(tmp_path / "run", stop_grace_s=2.0)
    try:
        launcher.apply({"svc": spec})
        state = (tmp_path / "run" / "state.json").read_text()
        deadline = time.monotonic() + 10
        while "token=" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = log.read_text()
        assert f"token={TOKEN}" in text  # control: the service got the real value
        header = [ln for ln in text.splitlines() if ln.startswith("=== autotune: start")]
        assert header and _canaries(header[0]) == [] and REDACTED in header[0]
        assert _canaries(state) == [] and REDACTED in state
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert httpx.get(spec.health_url, timeout=2).status_code == 200
    finally:
        launcher.close()
    assert not os.path.exists(tmp_path / "run" / "state.json")
