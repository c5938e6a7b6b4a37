"""Planted secrets: a real study through the CLI must not write them anywhere.

The deployment gives its services ``HF_TOKEN=hf_CANARY...`` and ``--api-key sk-CANARY...``
(both spellings) and names a host whose key file holds a planted private key; it runs once
with every service local and once with prefill over real SSH with that key (the remote
tests' loopback sshd, where root and sshd are available). The servers print their
credentials to their logs like SGLang does. One trial crashes (CUDA
OOM), so a log tail is copied into the study. Then every product autotune writes is grepped:
the SQLite file's bytes, the report, every export format, all CLI output, and autotune's own
files in the run directories. Controls prove each grep could fail: the services did get the
real values, their own logs hold them, and the study holds the scrubbed log line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from e2e_helpers import E2E_STUDY, FAST_CONFIG, REPO, autotune_cli
from optuna.trial import TrialState

from autotune.ports import pick_free_port as _free_port
from autotune.space import load_space

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
]

HF_TOKEN = "hf_CANARYtok3nQ7x9Lp2"
API_KEY = "sk-CANARYk3yPrefill81"
API_KEY_EQ = "sk-CANARYk3yDecode52"
KEYED = Path(__file__).resolve().parent / "keyed_server.py"
SPACE = REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"
BUNDLED = REPO / "launchers" / "sim-dsv4-flash-pd.yaml"
OOM = {
    "speculative": "eagle",
    "speculative_num_steps": 4,
    "mem_fraction_static": 0.95,
    "cuda_graph_max_bs_decode": 256,
}


@pytest.fixture(scope="module", params=["local", "ssh"])
def lab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[object | None]:
    """``local``: every service a child of the tuner (the local launcher), the planted key
    on a declared host. ``ssh``: prefill over real SSH with that key (the remote tests'
    loopback sshd; needs root and sshd), the rest through the process manager here."""
    from sshd_hosts import acquire_lab, release_lab, skip_reason

    if request.param == "local":
        yield None
        return
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    built = acquire_lab(tmp_path_factory.mktemp("sshd-lab"))
    try:
        yield built
    finally:
        release_lab()


def _keyed(command: list[str], *key_args: str) -> list[str]:
    """``${python} -m autotune.sim.server FLAGS`` -> ``${python} keyed_server.py KEY FLAGS``."""
    assert command[1:3] == ["-m", "autotune.sim.server"], command
    return [command[0], str(KEYED), *key_args, *command[3:]]


def _write_study(tmp: Path, lab: object | None, key_file: Path) -> Path:
    dep = yaml.safe_load(BUNDLED.read_text())
    dep["name"] = "sec-sim"
    dep["run_dir"] = str(tmp / "runs")
    prefill, decode = dep["services"]["prefill"], dep["services"]["decode"]
    prefill["command"] = _keyed(prefill["command"], "--api-key", API_KEY)
    decode["command"] = _keyed(decode["command"], f"--api-key={API_KEY_EQ}")
    for svc in (prefill, decode):
        svc["env"]["HF_TOKEN"] = HF_TOKEN
    host: dict[str, object] = {
        "address": "127.0.0.1",
        "user": "root",
        "key_file": str(key_file),
        "run_dir": str(tmp / "host-run"),
        "connect_timeout_s": 5,
    }
    if lab is not None:
        server = lab.servers["loopback"]  # type: ignore[attr-defined]
        host.update(port=server.port, known_hosts=str(lab.known_hosts))  # type: ignore[attr-defined]
        # over SSH: fixed ports (its KV bootstrap server's too)
        prefill.update(on="gpu", manager="process", port=_free_port())
        prefill["ports"] = {"bootstrap": _free_port()}
    dep["hosts"] = {"gpu": host}
    (tmp / "deployment.yaml").write_text(yaml.safe_dump(dep, sort_keys=False))
    study = yaml.safe_load(E2E_STUDY.read_text())
    study.update(name="sec", space=str(SPACE), deployment=str(tmp / "deployment.yaml"))
    path = tmp / "sec-study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def _planted_key(tmp: Path, lab: object | None) -> tuple[Path, list[str]]:
    """The key file and the lines of its private key that must never be written anywhere."""
    if lab is not None:
        return lab.client_key, lab.private_key_lines()  # type: ignore[attr-defined]
    import subprocess

    key = tmp / "planted_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    lines = [ln for ln in key.read_text().splitlines() if ln and not ln.startswith("-----")]
    return key, lines


def _canaries(key_lines: list[str]) -> list[str]:
    return [HF_TOKEN, API_KEY, API_KEY_EQ, "CANARY", *key_lines, *(k[:24] for k in key_lines)]


def _leaks(blob: str | bytes, canaries: list[str]) -> list[str]:
    text = blob.decode("utf-8", "replace") if isinstance(blob, bytes) else blob
    return [c for c in canaries if c in text]


def _preseed(db: Path) -> None:
    """Trial 0 the baseline, trial 1 an OOM crash (its log tail is stored), trial 2 the
    baseline again (reused, so a stored trial is copied)."""
    space = load_space(SPACE)
    names = {p.name for p in space.sampled_params}
    fast = {k: v for k, v in FAST_CONFIG.items() if k in names}
    oom = {k: v for k, v in {**fast, **OOM}.items() if k in names or k in OOM}
    study = optuna.create_study(
        study_name="sec", storage=f"sqlite:///{db}", directions=["maximize"]
    )
    study.enqueue_trial(space.baseline_params(), user_attrs={"is_baseline": True})
    study.enqueue_trial(oom)
    study.enqueue_trial(space.baseline_params())


def test_no_planted_secret_leaves_the_services(
    lab: object | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HF_TOKEN", "API_KEY"):
        monkeypatch.delenv(name, raising=False)
    key_file, key_lines = _planted_key(tmp_path, lab)
    assert len(key_lines) >= 2
    canaries = _canaries(key_lines)
    study_file = _write_study(tmp_path, lab, key_file)
    db = tmp_path / "sec.db"
    _preseed(db)
    storage = ["--study", "sec", "--storage", f"sqlite:///{db}"]
    outputs: dict[str, str] = {}

    run = autotune_cli(
        "run", "--trials", "3", *storage, "--study-file", str(study_file), cwd=tmp_path
    )
    outputs["run"] = run.stdout + run.stderr

    trials = optuna.load_study(study_name="sec", storage=f"sqlite:///{db}").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3, outputs["run"]
    base, oom, reused = trials
    assert base.user_attrs["failure"] is None, base.user_attrs.get("reason")
    assert oom.user_attrs["failure"] == "cuda_oom", oom.user_attrs.get("reason")
    assert reused.user_attrs["reused_from"] == 0
    # Controls: the stored records still name the secret settings (redacted, not dropped),
    # and the crash's log tail was copied, with the server's credential line scrubbed.
    services = base.user_attrs["services"]
    assert services["prefill"]["env"]["HF_TOKEN"] == "<redacted>"
    assert "--api-key" in services["prefill"]["argv"]
    assert "--api-key=<redacted>" in services["decode"]["argv"]
    assert "server_args=ServerArgs(api_key='<redacted>'" in oom.user_attrs["log_tail"]

    out = tmp_path / "deploy"
    for args in (
        ["best"],
        ["best", "--export", "systemd", "--out", str(out)],
        ["best", "--export", "env"],
        ["best", "--export", "command"],
        ["best", "--export", "json"],
        ["best", "--export", "json", "--out", str(tmp_path / "json-out")],
        ["report", "--out", str(tmp_path / "report.html")],
    ):
        proc = autotune_cli(*args, *storage, cwd=tmp_path)
        outputs[" ".join(args[:3])] = proc.stdout + proc.stderr
    assert "<redacted>" not in outputs["best --export command"]  # references, not blanks
    assert "${HF_TOKEN" in outputs["best --export env"]

    products: dict[str, bytes] = {"report": (tmp_path / "report.html").read_bytes()}
    for path in [db, *tmp_path.glob("sec.db-*")]:
        products[path.name] = path.read_bytes()
    for path in [*out.rglob("*"), *(tmp_path / "json-out").rglob("*")]:
        if not path.is_file():
            continue
        if path.suffix == ".env":  # the secrets' EnvironmentFile=: owner-only by design
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        products[str(path.relative_to(tmp_path))] = path.read_bytes()
    assert any(p.endswith(".env") for p in products), sorted(products)

    # autotune's own files beside the services: state, metadata, the log headers it writes.
    # The remote NAME.env is the service's environment (owner-only, like a unit's
    # EnvironmentFile=); the rest of a log is the service's own output.
    own_logs = 0
    for root in (tmp_path / "runs", tmp_path / "host-run"):
        for path in root.rglob("*"):
            if not path.is_file():
                continue
            text = path.read_text(errors="replace")
            if path.suffix == ".env":
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
                if path.stem != "router":
                    assert HF_TOKEN in text  # control: the service's environment is there
            elif path.suffix == ".log":
                header = "\n".join(ln for ln in text.splitlines() if ln.startswith("=== autotune"))
                products[f"{path} (autotune lines)"] = header.encode()
                own_logs += 1
                if "prefill" in path.name or "decode" in path.name:
                    # Control: the servers got the real credentials and printed them.
                    assert "api_key='sk-CANARY" in text, path
            else:
                products[str(path)] = path.read_bytes()
    assert own_logs >= 3
    if lab is not None:
        assert list((tmp_path / "host-run").rglob("prefill.env")), "prefill did not run on SSH"

    blobs: dict[str, str | bytes] = {**outputs, **products}
    leaks = {name: _leaks(blob, canaries) for name, blob in blobs.items()}
    assert not {k: v for k, v in leaks.items() if v}, leaks
    assert _leaks(f"x {API_KEY} {key_lines[0]}", canaries)  # the grep itself works

    # With the study file, the export fills the secrets file from the deployment as it is
    # now (0600), and still no unit or printed line holds a value.
    filled = tmp_path / "deploy-filled"
    proc = autotune_cli(
        "best", "--export", "systemd", "--out", str(filled), *storage,
        "--study-file", str(study_file), cwd=tmp_path,
    )  # fmt: skip
    assert not _leaks(proc.stdout + proc.stderr, canaries)
    env_files = [p for p in filled.rglob("*.env") if p.is_file()]
    assert env_files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in env_files)
    assert any(HF_TOKEN in p.read_text() for p in env_files)
    assert not any("__FILL_IN__" in p.read_text() for p in env_files)
    others = [p for p in filled.rglob("*") if p.is_file() and p.suffix != ".env"]
    assert others and not any(_leaks(p.read_bytes(), canaries) for p in others)


def test_redaction_off_would_have_been_caught(tmp_path: Path) -> None:
    """Control for the grep: the same canaries stored unredacted are found in the file."""
    db = tmp_path / "raw.db"
    study = optuna.create_study(study_name="raw", storage=f"sqlite:///{db}")
    trial = study.ask()
    study._storage.set_trial_user_attr(  # bypasses autotune.study.record on purpose
        trial._trial_id, "services", {"prefill": {"env": {"HF_TOKEN": HF_TOKEN}}}
    )
    study.tell(trial, 1.0)
    assert _leaks(db.read_bytes(), [HF_TOKEN]) == [HF_TOKEN]
    assert os.path.getsize(db) > 0
