"""SystemdManager against the stand-in systemctl/journalctl (tests/remote/fake_systemd).

The stand-ins really run the merged unit + drop-in (see ``_fakesd.py``), so these tests see
the command and environment a service would get from systemd. The drop-in is also checked
by the real ``systemd-analyze verify`` beside a unit file, like the systemd export's tests.
"""

from __future__ import annotations

import json
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from managers_support import (
    FAKE_SYSTEMD,
    PY,
    SERVICE,
    SIM_OOM,
    FakeSystemd,
    free_port,
    healthy,
    running,
    service_spec,
    sim_spec,
    wait_until,
)
from systemd_verify import SYSTEMD_ANALYZE, verify

from autotune.errors import ConfigError
from autotune.launch.classify import FailureClass, classify_line
from autotune.remote.dropin import (
    DROPIN_NAME,
    dropin_mode,
    looks_secret,
    normalize_unit,
    render_dropin,
)
from autotune.remote.managers import SystemdManager, create_manager

sys.path.insert(0, str(FAKE_SYSTEMD))
from _fakesd import split_words  # noqa: E402  (the stand-in's systemd.syntax parser)

UNIT = "sglang-decode.service"
NASTY_ENV = {
    "SPACES": "x y  z",
    "QUOTES": "a\"b'c",
    "PERCENT": "100%",
    "SPECIFIER": "%n%Z",
    "DOLLAR": "$HOME and ${PATH}",
    "BACKSLASH": "C:\\path\\",
    "TAB": "a\tb",
    "SUBST": "$(touch /tmp/autotune-canary-never)",
}
NASTY_ARGS = ["a b", 'say "hi"', "50%", "%i", "$HOME", "${PATH}", "$$", "back\\slash", ";", "it's"]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeSystemd]:
    sd = FakeSystemd(tmp_path)
    yield sd
    sd.cleanup()


def make_manager(fake: FakeSystemd, tmp_path: Path) -> SystemdManager:
    return SystemdManager(
        shell=fake.shell,
        deployment="dep",
        run_dir=str(tmp_path / "run"),
        unit_dir=str(fake.unit_dir),
        sudo=False,
        stop_grace_s=2.0,
    )


def base_unit(fake: FakeSystemd, *, start: bool) -> int:
    """The user's own decode unit: the fixture server on a port of its own."""
    port = free_port()
    fake.write_unit(
        UNIT,
        [
            PY,
            str(SERVICE),
            "--port",
            str(port),
            "--log",
            "base-unit-running",
            "--print-env",
            "KEEP",
            "--print-env",
            "NCCL_PROTO",
        ],
        env='Environment="NCCL_PROTO=LL" "KEEP=from unit" DROP=unit',
    )
    assert fake.systemctl("daemon-reload").returncode == 0
    if start:
        assert fake.systemctl("start", UNIT).returncode == 0
        assert wait_until(lambda: healthy(f"http://127.0.0.1:{port}/health"), timeout_s=10)
    return port


def dropin_file(fake: FakeSystemd) -> Path:
    return fake.unit_dir / f"{UNIT}.d" / DROPIN_NAME


def settings(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


# ------------------------------------------------------------------ the drop-in text
def test_dropin_text_resets_execstart_and_quotes_values() -> None:
    spec = service_spec(
        "decode",
        *NASTY_ARGS,
        env=NASTY_ENV,
        unset_env=["NCCL_ALGO", "DROP"],
        manager="systemd",
        unit=UNIT,
    )
    text = render_dropin(spec, executable=PY, deployment="dep", unit=UNIT)
    lines = text.splitlines()
    assert lines.index("[Service]") < lines.index("ExecStart=") < lines.index("Restart=no")
    assert settings(text, "ExecStart")[0] == ""  # the reset comes first
    assert split_words(settings(text, "ExecStart")[1].replace("$$", "$").replace("%%", "%")) == [
        PY,
        str(SERVICE),
        "--port",
        str(spec.port),
        *NASTY_ARGS,
    ]
    parsed = dict(
        split_words(v)[0].replace("%%", "%").split("=", 1) for v in settings(text, "Environment")
    )
    assert parsed == NASTY_ENV
    assert settings(text, "UnsetEnvironment") == ["DROP NCCL_ALGO"]
    assert "StartLimitIntervalSec=0" in lines and lines.index("[Unit]") < lines.index("[Service]")


@pytest.mark.parametrize(
    ("update", "match"),
    [
        ({"env": {"BAD": "two\nlines"}}, "newline"),
        ({"argv": (PY, "two\nlines")}, "newline"),
        ({"env": {"BAD NAME": "x"}}, "BAD NAME"),
        ({"unset_env": ("BAD NAME",)}, "BAD NAME"),
        ({"env": {"A": "1"}, "unset_env": ("A",)}, "both set and unset"),
        ({"workdir": "relative/dir"}, "absolute"),
    ],
)
def test_dropin_refuses_what_a_unit_file_cannot_carry(
    update: dict[str, object], match: str
) -> None:
    spec = service_spec("decode", manager="systemd", unit=UNIT).model_copy(update=update)
    with pytest.raises(ConfigError, match=match):
        render_dropin(spec, executable=PY, deployment="dep", unit=UNIT)
    with pytest.raises(ConfigError, match="absolute"):
        render_dropin(service_spec("decode"), executable="python3", deployment="d", unit=UNIT)


def test_secret_names_units_and_modes() -> None:
    assert all(looks_secret(n) for n in ("HF_TOKEN", "aws_secret_access_key", "DB_PASSWORD"))
    assert not any(looks_secret(n) for n in ("NCCL_PROTO", "CUDA_VISIBLE_DEVICES"))
    assert dropin_mode({"NCCL_PROTO": "LL"}) == 0o644
    assert dropin_mode({"NCCL_PROTO": "LL", "OPENAI_API_KEY": "x"}) == 0o600
    # A secret flag's value on the command line makes the drop-in a secret too.
    assert dropin_mode({}, ["srv", "--api-key", "sk-x"]) == 0o600
    assert dropin_mode({}, ["srv", "--admin-api-key=sk-x"]) == 0o600
    assert dropin_mode({}, ["srv", "--tokenizer-path", "/m", "--max-total-tokens", "9"]) == 0o644
    assert normalize_unit("sglang-decode", service="d") == "sglang-decode.service"
    assert normalize_unit("sglang@1.service", service="d") == "sglang@1.service"
    for bad in (None, "", "a b", "x.socket", "-x"):
        with pytest.raises(ConfigError, match="unit"):
            normalize_unit(bad, service="d")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed")
def test_written_dropin_passes_systemd_analyze_verify(fake: FakeSystemd, tmp_path: Path) -> None:
    base_unit(fake, start=False)
    mgr = make_manager(fake, tmp_path)
    spec = service_spec(
        "decode", *NASTY_ARGS, env=NASTY_ENV, unset_env=["DROP"], manager="systemd", unit=UNIT
    )
    mgr.start(spec)
    unit = fake.unit_dir / UNIT
    proc = verify(unit)
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", proc.stdout + proc.stderr
    # Negative control: without the ExecStart= reset the merged unit has two commands.
    text = dropin_file(fake).read_text()
    dropin_file(fake).write_text("\n".join(ln for ln in text.splitlines() if ln != "ExecStart="))
    bad = verify(unit)
    assert bad.returncode != 0 and "more than one ExecStart" in bad.stdout + bad.stderr
    dropin_file(fake).write_text(text)
    mgr.stop("decode", grace_s=2)


# ------------------------------------------------------------------ running units
def test_sim_runs_through_the_dropin_and_restore_returns_the_active_unit(
    fake: FakeSystemd, tmp_path: Path
) -> None:
    base_port = base_unit(fake, start=True)
    base_pid = fake.main_pid(UNIT)
    mgr = make_manager(fake, tmp_path)
    spec = sim_spec("decode", manager="systemd", unit="sglang-decode")
    mgr.start(spec)
    assert wait_until(lambda: healthy(spec.health_url), timeout_s=20), mgr.log_tail("decode")
    assert mgr.alive("decode")
    assert not running(base_pid) and not healthy(f"http://127.0.0.1:{base_port}/health")

    text = dropin_file(fake).read_text()
    assert settings(text, "ExecStart")[0] == ""
    assert settings(text, "ExecStart")[1].startswith(f"{PY} -m autotune.sim.server ")
    assert 'Environment="AUTOTUNE_SIM_LOAD_SECONDS=0.1"' in text.splitlines()
    assert stat.S_IMODE(dropin_file(fake).stat().st_mode) == 0o644

    # The journal of this invocation only: the base unit's lines are not in it.
    tail = mgr.log_tail("decode")
    assert "fired up" in tail and "base-unit-running" not in tail
    assert "base-unit-running" in fake.journal(UNIT)  # ... though the unit's journal has them
    since, count = mgr.log_since("decode", 0)
    assert "fired up" in since and count == len(since.splitlines())
    assert mgr.log_since("decode", count) == ("", count)

    state_file = tmp_path / "run" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["units"][UNIT]["was_active"] is True
    assert state["units"][UNIT]["previous_dropin"] is None
    assert state["services"]["decode"]["unit"] == UNIT
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
    inv = create_manager(
        "systemd", shell=fake.shell, deployment="dep", run_dir=str(tmp_path / "run"), sudo=False
    )
    listed = inv.inventory()["units"][UNIT]
    assert listed["dropin_present"] and listed["was_active"] and listed["service"] == "decode"

    mgr.restore("decode")
    assert not dropin_file(fake).exists() and not dropin_file(fake).parent.exists()
    assert not state_file.exists()
    assert fake.active(UNIT) == "active"
    assert wait_until(lambda: healthy(f"http://127.0.0.1:{base_port}/health"), timeout_s=10)
    assert not healthy(spec.health_url)
    assert mgr.inventory()["units"] == {}


def test_restore_keeps_an_inactive_unit_stopped_and_puts_back_a_previous_dropin(
    fake: FakeSystemd, tmp_path: Path
) -> None:
    base_unit(fake, start=False)
    previous = '[Service]\nEnvironment="OPERATOR_SETTING=1"\n'
    dropin_file(fake).parent.mkdir()
    dropin_file(fake).write_text(previous)
    dropin_file(fake).chmod(0o640)
    assert fake.systemctl("daemon-reload").returncode == 0

    mgr = make_manager(fake, tmp_path)
    first = service_spec("decode", manager="systemd", unit=UNIT)
    mgr.start(first)
    assert wait_until(lambda: healthy(first.health_url), timeout_s=10)
    # A second session (fresh manager, other config) keeps the first pre-tuning record.
    second = service_spec("decode", "--log", "second", manager="systemd", unit=UNIT)
    again = make_manager(fake, tmp_path)
    again.start(second)
    assert wait_until(lambda: healthy(second.health_url), timeout_s=10)
    assert not healthy(first.health_url)
    record = json.loads((tmp_path / "run" / "state.json").read_text())["units"][UNIT]
    assert record["was_active"] is False and record["previous_dropin"] == previous

    again.restore("decode")
    assert dropin_file(fake).read_text() == previous
    assert stat.S_IMODE(dropin_file(fake).stat().st_mode) == 0o640
    assert fake.active(UNIT) in ("inactive", "failed")
    assert not healthy(second.health_url)


def test_environment_reaches_the_service_as_systemd_would_pass_it(
    fake: FakeSystemd, tmp_path: Path
) -> None:
    base_unit(fake, start=False)
    mgr = make_manager(fake, tmp_path)
    env = {**NASTY_ENV, "NCCL_PROTO": "Simple", "HF_TOKEN": "hunter2"}
    args = []
    for name in [*env, "KEEP", "DROP", "HOME"]:
        args += ["--print-env", name]
    args += [a for arg in NASTY_ARGS for a in ("--log", f"ARG<{arg}>")]
    spec = service_spec("decode", *args, env=env, unset_env=["DROP"], manager="systemd", unit=UNIT)
    mgr.start(spec)
    assert wait_until(lambda: "listening=" in mgr.log_tail("decode"), timeout_s=10)
    log = mgr.log_tail("decode", lines=200)
    for name, value in env.items():
        assert f"env {name}={value}" in log
    assert "env KEEP=from unit" in log  # the unit's own variables stay
    assert "env DROP=<unset>" in log  # UnsetEnvironment= removes the unit's variable
    assert "env HOME=<unset>" in log  # a clean environment, not the tuner's
    for arg in NASTY_ARGS:
        assert f"ARG<{arg}>" in log
    assert stat.S_IMODE(dropin_file(fake).stat().st_mode) == 0o600  # HF_TOKEN
    assert not Path("/tmp/autotune-canary-never").exists()
    # The state file keeps what restore needs, not the credential; owner-only directory.
    run = tmp_path / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert stat.S_IMODE((run / "state.json").stat().st_mode) == 0o600
    state = (run / "state.json").read_text()
    assert "HF_TOKEN=<redacted>" in state and "hunter2" not in state
    assert "hunter2" in dropin_file(fake).read_text()  # control: systemd needs the value
    mgr.stop(spec, grace_s=2)
    assert not mgr.alive("decode")


def test_oom_is_classified_from_the_journal(fake: FakeSystemd, tmp_path: Path) -> None:
    base_unit(fake, start=False)
    mgr = make_manager(fake, tmp_path)
    mgr.start(sim_spec("decode", *SIM_OOM, manager="systemd", unit=UNIT))
    offset = 0
    seen = ""
    prev = time.monotonic()
    latency = None
    while time.monotonic() - prev < 20:
        t = time.monotonic()
        text, offset = mgr.log_since("decode", offset)
        seen += text
        hits = [classify_line(line) for line in text.splitlines()]
        if any(h is not None and h[1] == FailureClass.cuda_oom for h in hits):
            latency = time.monotonic() - prev
            break
        prev = t
        time.sleep(0.2)
    assert latency is not None and latency < 2.0, seen
    assert mgr.classify("decode").failure == FailureClass.cuda_oom
    assert wait_until(lambda: not mgr.alive("decode"), timeout_s=10)
    assert fake.active(UNIT) == "failed"


def test_stop_sends_sigkill_after_the_grace_period(fake: FakeSystemd, tmp_path: Path) -> None:
    base_unit(fake, start=False)
    mgr = make_manager(fake, tmp_path)
    mgr.start(service_spec("decode", "--ignore-sigterm", manager="systemd", unit=UNIT))
    assert wait_until(lambda: "ignoring SIGTERM" in mgr.log_tail("decode"), timeout_s=10)
    pid = fake.main_pid(UNIT)
    t0 = time.monotonic()
    mgr.stop("decode", grace_s=0.5)
    # The service ignores SIGTERM and the manager stops with --no-block (the fake's own stop
    # timeout never fires): only the manager's SIGKILL can have ended it, after the grace.
    # The grace is counted in poll ticks, each a `systemctl is-active` (a Python start in the
    # fake): seconds apiece on a busy machine, hence the loose upper bound.
    assert 0.4 <= time.monotonic() - t0 < 30
    assert not running(pid) and not mgr.alive("decode")


def test_start_errors_name_the_problem(fake: FakeSystemd, tmp_path: Path) -> None:
    mgr = make_manager(fake, tmp_path)
    with pytest.raises(ConfigError, match=f"{UNIT} is not installed"):
        mgr.start(service_spec("decode", manager="systemd", unit=UNIT))
    base_unit(fake, start=False)
    with pytest.raises(ConfigError, match="no-such-server-xyz"):
        mgr.start(service_spec("decode", manager="systemd", unit=UNIT, argv0="no-such-server-xyz"))
    with pytest.raises(ConfigError, match="names no unit"):
        mgr.start(service_spec("decode", manager="systemd"))
    assert not dropin_file(fake).exists()  # nothing was changed
    assert not (tmp_path / "run" / "state.json").exists()

    # A program found on the host's PATH is written as its absolute path.
    mgr.start(service_spec("decode", manager="systemd", unit=UNIT, argv0="python3"))
    exec_start = settings(dropin_file(fake).read_text(), "ExecStart")[1]
    assert exec_start.split()[0] == shutil.which("python3", path=fake.env["PATH"])
    mgr.restore("decode")


def test_stand_in_refuses_a_merged_unit_with_two_commands(fake: FakeSystemd) -> None:
    """Guards the stand-in: it reads drop-ins and enforces the ExecStart= reset."""
    fake.write_unit(UNIT, ["/bin/sleep", "30"])
    dropin_file(fake).parent.mkdir()
    dropin_file(fake).write_text("[Service]\nExecStart=/bin/sleep 31\n")
    assert fake.systemctl("daemon-reload").returncode == 0
    res = fake.systemctl("start", UNIT)
    assert res.returncode != 0 and "bad unit file setting" in res.stderr
    dropin_file(fake).write_text("[Service]\nExecStart=\nExecStart=/bin/sleep 31\n")
    assert fake.systemctl("start", UNIT).returncode != 0  # not reloaded yet: old config
    assert fake.systemctl("daemon-reload").returncode == 0
    assert fake.systemctl("start", UNIT).returncode == 0
    assert fake.active(UNIT) == "active"
    assert fake.systemctl("stop", UNIT).returncode == 0
    assert fake.active(UNIT) == "inactive"
