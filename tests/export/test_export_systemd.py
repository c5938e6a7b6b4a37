"""systemd export: every unit and drop-in is checked by the real ``systemd-analyze verify``.

Drop-ins are verified the way systemd loads them: ``systemd-analyze verify DIR/NAME.service``
adds DIR to the unit search path, so ``DIR/NAME.service.d/*.conf`` is merged into the unit.
A negative control (the same drop-in without the empty ``ExecStart=`` reset) must fail, which
proves the drop-in is really read.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest_results import TrialSpec, make_study, record
from systemd_verify import SYSTEMD_ANALYZE, verify

from autotune.errors import ConfigError
from autotune.export import export, export_systemd
from autotune.results import TrialResult, best_trial, load_results

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

needs_systemd = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (Debian package: systemd)"
)
PY = os.path.abspath(sys.executable)

NASTY_ENV = {
    "SPACES": "x y  z",
    "QUOTES": "a\"b'c",
    "PERCENT": "100%",
    "SPECIFIER": "%n%Z",
    "DOLLAR": "$HOME and ${PATH}",
    "BACKSLASH": "C:\\path\\",
    "MIX": 'a "b" %c $d \\e\tf',
}
NASTY_ARGS = [
    "a b",
    'say "hi"',
    "50%",
    "%i",
    "$HOME",
    "${PATH}",
    "$$",
    "back\\slash",
    ";",
    "it's",
    "",
    "tab\there",
    "--flag=v,w:x/y",
]


def assert_clean(path: Path) -> None:
    proc = verify(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout + proc.stderr == "", proc.stdout + proc.stderr


# A test oracle written from systemd.syntax(7) / systemd.service(5), independent of the code:
# words are whitespace separated, "..." quotes with C escapes, %% -> %, and in ExecStart $$ -> $.
_WORD = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
_C_ESCAPES = {"\\": "\\", '"': '"', "t": "\t", "'": "'"}


def systemd_words(text: str, *, exec_line: bool) -> list[str]:
    words = []
    for quoted, bare in _WORD.findall(text):
        word = bare or re.sub(r"\\(.)", lambda m: _C_ESCAPES[m.group(1)], quoted)
        word = word.replace("%%", "\0")
        assert "%" not in word, f"unescaped specifier in {word!r}"
        word = word.replace("\0", "%")
        if exec_line:
            word = word.replace("$$", "\0")
            assert "$" not in word, f"unescaped $ in {word!r}"
            word = word.replace("\0", "$")
        words.append(word)
    return words


def settings(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


def one_service_trial(
    tmp_path: Path,
    *,
    argv: list[str],
    env: dict[str, str] | None = None,
    unset: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> TrialResult:
    rec = {**record(argv, env or {}, unset or []), **(extra or {})}
    study = make_study(tmp_path / "db", [TrialSpec(services={"worker": rec})])
    return load_results(study)[0]


@pytest.fixture
def pd_trial(tmp_path: Path) -> TrialResult:
    study = make_study(
        tmp_path / "db",
        [
            TrialSpec(throughput=25.0, is_baseline=True),
            TrialSpec(
                throughput=1234.5, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
            ),
        ],
    )
    best = best_trial(study)
    assert best is not None
    return best


@needs_systemd
def test_every_unit_verifies_cleanly(tmp_path: Path, pd_trial: TrialResult) -> None:
    paths = export_systemd(pd_trial, out_dir=tmp_path / "out")
    units = [p for p in paths if p.suffix == ".service"]
    assert sorted(p.name for p in units) == [
        "autotune-decode.service",
        "autotune-prefill.service",
        "autotune-router.service",
    ]
    for unit in units:
        assert_clean(unit)


def test_unit_contents(tmp_path: Path, pd_trial: TrialResult) -> None:
    export_systemd(pd_trial, out_dir=tmp_path / "out")
    units = tmp_path / "out" / "units"
    decode = (units / "autotune-decode.service").read_text()
    router = (units / "autotune-router.service").read_text()
    for text in (decode, router):
        assert "[Unit]" in text and "[Service]" in text and "[Install]" in text
        assert "Wants=network-online.target" in text
        for line in (
            "Type=simple",
            "Restart=on-failure",
            "KillMode=control-group",
            "WantedBy=multi-user.target",
        ):
            assert line in text.splitlines()
        assert settings(text, "RestartSec") and settings(text, "LimitNOFILE")
        (exec_start,) = settings(text, "ExecStart")
        assert exec_start.startswith(PY + " ")
        assert int(settings(text, "TimeoutStartSec")[0]) >= 600
    assert "Description=autotune decode (trial 1)" in decode
    assert settings(decode, "After") == ["network-online.target"]
    assert not settings(decode, "Requires")
    assert settings(decode, "UnsetEnvironment") == ["NCCL_PROTO"]
    assert 'Environment="CUDA_VISIBLE_DEVICES=4,5,6,7"' in decode
    assert 'Environment="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"' in decode
    # The router needs both workers: ordered after them and stopped/restarted with them.
    (after,) = settings(router, "After")
    assert set(after.split()) == {
        "network-online.target",
        "autotune-prefill.service",
        "autotune-decode.service",
    }
    (requires,) = settings(router, "Requires")
    assert set(requires.split()) == {"autotune-prefill.service", "autotune-decode.service"}


@needs_systemd
def test_dropin_really_applies_to_an_existing_unit(tmp_path: Path, pd_trial: TrialResult) -> None:
    export_systemd(pd_trial, out_dir=tmp_path / "out")
    dropin = tmp_path / "out" / "dropins" / "autotune-decode.service.d" / "50-autotune.conf"
    text = dropin.read_text()
    assert settings(text, "ExecStart")[0] == ""  # reset first
    assert settings(text, "ExecStart")[1].startswith(PY + " ")
    assert settings(text, "UnsetEnvironment") == ["NCCL_PROTO"]
    assert 'Environment="CUDA_VISIBLE_DEVICES=4,5,6,7"' in text

    etc = tmp_path / "etc"
    (etc / "autotune-decode.service.d").mkdir(parents=True)
    existing = etc / "autotune-decode.service"
    existing.write_text(
        "[Unit]\nDescription=the user's own decode unit\n\n[Service]\nType=simple\n"
        f'Environment="NCCL_PROTO=LL"\nExecStart={PY} -m old.server --port 1\n\n'
        "[Install]\nWantedBy=multi-user.target\n"
    )
    assert_clean(existing)  # the base unit alone is fine

    installed = etc / "autotune-decode.service.d" / "50-autotune.conf"
    shutil.copy(dropin, installed)
    assert_clean(existing)  # unit + drop-in merged: still exactly one ExecStart

    # Negative control: without the empty ExecStart= the merged unit has two commands, which
    # systemd refuses for Type=simple. Failing here proves verify read the drop-in.
    installed.write_text("\n".join(line for line in text.splitlines() if line != "ExecStart="))
    proc = verify(existing)
    assert proc.returncode != 0
    assert "more than one ExecStart" in proc.stdout + proc.stderr


@needs_systemd
def test_quoting_round_trips_and_verifies(tmp_path: Path) -> None:
    trial = one_service_trial(
        tmp_path, argv=[PY, "-c", "pass", *NASTY_ARGS], env=NASTY_ENV, unset=["NCCL_ALGO"]
    )
    export_systemd(trial, out_dir=tmp_path / "out")
    unit = tmp_path / "out" / "units" / "autotune-worker.service"
    assert_clean(unit)
    text = unit.read_text()

    env_lines = settings(text, "Environment")
    parsed = dict(systemd_words(v, exec_line=False)[0].split("=", 1) for v in env_lines)
    assert parsed == NASTY_ENV
    (exec_start,) = settings(text, "ExecStart")
    assert systemd_words(exec_start, exec_line=True) == [PY, "-c", "pass", *NASTY_ARGS]
    # Spot checks of the documented escapes.
    assert 'Environment="PERCENT=100%%"' in text
    assert 'Environment="DOLLAR=$HOME and ${PATH}"' in text  # no $ expansion in Environment=
    assert '"$$HOME"' in exec_start and '"50%%"' in exec_start and '";"' in exec_start
    assert 'Environment="QUOTES=a\\"b\'c"' in text

    dropin = tmp_path / "out" / "dropins" / "autotune-worker.service.d" / "50-autotune.conf"
    etc = tmp_path / "etc"
    (etc / "autotune-worker.service.d").mkdir(parents=True)
    (etc / "autotune-worker.service").write_text(
        f"[Unit]\nDescription=x\n[Service]\nExecStart={PY} -c pass\n"
    )
    shutil.copy(dropin, etc / "autotune-worker.service.d" / "50-autotune.conf")
    assert_clean(etc / "autotune-worker.service")


@needs_systemd
def test_unescaped_specifier_would_be_caught_by_verify(tmp_path: Path) -> None:
    """Guards the check itself: verify does flag a bare %Z, so passing above means something."""
    unit = tmp_path / "bad.service"
    unit.write_text(f'[Service]\nEnvironment="A=%Z"\nExecStart={PY} -c pass\n')
    proc = verify(unit)
    assert proc.returncode != 0
    assert "specifiers" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([PY, "-c", "pass"], {"BAD": "line1\nline2"}),
        ([PY, "-c", "pass", "two\nlines"], {}),
        ([PY, "-c", "pass", "cr\rhere"], {}),
    ],
)
def test_newlines_are_refused(tmp_path: Path, argv: list[str], env: dict[str, str]) -> None:
    trial = one_service_trial(tmp_path, argv=argv, env=env)
    with pytest.raises(ConfigError, match="newline"):
        export_systemd(trial, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_invalid_variable_name_is_refused(tmp_path: Path) -> None:
    trial = one_service_trial(tmp_path, argv=[PY], env={"BAD NAME": "x"})
    with pytest.raises(ConfigError, match="BAD NAME"):
        export_systemd(trial, out_dir=tmp_path / "out")


def test_unresolvable_executable_is_named(tmp_path: Path) -> None:
    trial = one_service_trial(tmp_path, argv=["no-such-server-binary-xyz", "--port", "1"])
    with pytest.raises(ConfigError, match="no-such-server-binary-xyz"):
        export_systemd(trial, out_dir=tmp_path / "out")


def test_relative_executable_is_resolved_on_path(tmp_path: Path) -> None:
    sh = shutil.which("sh")
    assert sh is not None
    trial = one_service_trial(tmp_path, argv=["sh", "-c", "exec sleep 1"])
    export_systemd(trial, out_dir=tmp_path / "out")
    text = (tmp_path / "out" / "units" / "autotune-worker.service").read_text()
    (exec_start,) = settings(text, "ExecStart")
    assert exec_start.split()[0] == os.path.abspath(sh)


@needs_systemd
def test_user_working_directory_prefix_and_timeout(tmp_path: Path) -> None:
    trial = one_service_trial(tmp_path, argv=[PY, "-c", "pass"], extra={"ready_timeout_s": 1200})
    out = tmp_path / "out"
    paths = export_systemd(
        trial, out_dir=out, unit_prefix="llm-", user="root", working_directory=tmp_path
    )
    unit = out / "units" / "llm-worker.service"
    assert unit in paths
    text = unit.read_text()
    assert "User=root" in text.splitlines()
    assert f"WorkingDirectory={tmp_path}" in text.splitlines()
    assert settings(text, "TimeoutStartSec") == ["1800"]
    assert_clean(unit)


def test_bad_prefix_and_relative_workdir_are_refused(tmp_path: Path) -> None:
    trial = one_service_trial(tmp_path, argv=[PY])
    with pytest.raises(ConfigError, match="unit name"):
        export_systemd(trial, out_dir=tmp_path / "a", unit_prefix="bad prefix ")
    with pytest.raises(ConfigError, match="absolute"):
        export_systemd(trial, out_dir=tmp_path / "b", working_directory="relative/dir")


def test_stored_dependencies_win_and_cycles_are_refused(tmp_path: Path) -> None:
    services = {
        "a": {**record([PY, "-m", "a"], {}, []), "depends_on": ["b"]},
        "b": {**record([PY, "-m", "b"], {}, []), "depends_on": []},
    }
    study = make_study(tmp_path / "ok", [TrialSpec(services=services)])
    export_systemd(load_results(study)[0], out_dir=tmp_path / "out")
    text = (tmp_path / "out" / "units" / "autotune-a.service").read_text()
    assert settings(text, "Requires") == ["autotune-b.service"]
    services["b"]["depends_on"] = ["a"]
    cyclic = make_study(tmp_path / "cyc", [TrialSpec(services=services)])
    with pytest.raises(ConfigError, match="cycle"):
        export_systemd(load_results(cyclic)[0], out_dir=tmp_path / "out2")


def _fake_systemctl(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "systemctl.log"
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    return fake, log


def test_install_script_copies_and_restarts_in_dependency_order(
    tmp_path: Path, pd_trial: TrialResult
) -> None:
    out = tmp_path / "out"
    paths = export_systemd(pd_trial, out_dir=out)
    script = out / "install.sh"
    assert script in paths and os.access(script, os.X_OK)
    fake, log = _fake_systemctl(tmp_path)
    unit_dir = tmp_path / "etc-systemd"
    env = {**os.environ, "UNIT_DIR": str(unit_dir), "SYSTEMCTL": str(fake)}
    proc = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    for name in ("prefill", "decode", "router"):
        installed = unit_dir / f"autotune-{name}.service"
        assert installed.read_text() == (out / "units" / installed.name).read_text()
    calls = log.read_text().splitlines()
    assert calls[0] == "daemon-reload"
    assert calls[1].startswith("enable ")
    restarts = [c.split()[1] for c in calls if c.startswith("restart ")]
    assert restarts.index("autotune-router.service") == 2  # after both workers
    assert set(restarts[:2]) == {"autotune-prefill.service", "autotune-decode.service"}


def test_install_script_dropin_mode(tmp_path: Path, pd_trial: TrialResult) -> None:
    out = tmp_path / "out"
    export_systemd(pd_trial, out_dir=out)
    fake, log = _fake_systemctl(tmp_path)
    unit_dir = tmp_path / "etc-systemd"
    env = {**os.environ, "UNIT_DIR": str(unit_dir), "SYSTEMCTL": str(fake)}
    proc = subprocess.run(
        [str(out / "install.sh"), "dropins"], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    conf = unit_dir / "autotune-decode.service.d" / "50-autotune.conf"
    assert "ExecStart=\n" in conf.read_text()
    assert not (unit_dir / "autotune-decode.service").exists()
    calls = log.read_text().splitlines()
    assert calls[0] == "daemon-reload" and not any(c.startswith("enable") for c in calls)
    bad = subprocess.run(
        [str(out / "install.sh"), "bogus"], env=env, capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_readme_lists_trial_and_metrics(tmp_path: Path, pd_trial: TrialResult) -> None:
    export_systemd(pd_trial, out_dir=tmp_path / "out")
    text = (tmp_path / "out" / "README.txt").read_text()
    assert "trial 1" in text
    assert "output throughput: 1234.50 tok/s" in text
    assert "TPOT p99: 50.00 ms" in text
    assert "moe_runner_backend = marlin" in text
    assert "install.sh dropins" in text


def test_export_dispatch_for_systemd(tmp_path: Path, pd_trial: TrialResult) -> None:
    written = export(pd_trial, fmt="systemd", out_dir=tmp_path / "out")
    assert isinstance(written, list) and (tmp_path / "out" / "install.sh") in written
    with pytest.raises(ConfigError, match="output directory"):
        export(pd_trial, fmt="systemd", out_dir=None)


@needs_systemd
def test_a_vllm_unit_gets_a_runtime_directory_for_its_sockets(tmp_path: Path) -> None:
    """vLLM leaves ~7 ZMQ socket files in the temp directory at every start
    (``VLLM_RPC_BASE_PATH``): the exported unit points it at a ``RuntimeDirectory=``, which
    systemd removes at each stop; a study that set the variable keeps its own value."""
    argv = [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]
    trial = one_service_trial(tmp_path / "a", argv=argv)
    export_systemd(trial, out_dir=tmp_path / "out")
    unit = tmp_path / "out" / "units" / "autotune-worker.service"
    assert_clean(unit)
    text = unit.read_text()
    (directory,) = settings(text, "RuntimeDirectory")
    assert re.fullmatch(r"autotune-[0-9a-f]{12}", directory)
    assert settings(text, "RuntimeDirectoryMode") == ["0700"]
    assert f'Environment="VLLM_RPC_BASE_PATH=%t/{directory}"' in text.splitlines()
    dropin = tmp_path / "out" / "dropins" / "autotune-worker.service.d" / "50-autotune.conf"
    assert f"RuntimeDirectory={directory}" in dropin.read_text().splitlines()

    own = one_service_trial(tmp_path / "b", argv=argv, env={"VLLM_RPC_BASE_PATH": "/srv/rpc"})
    export_systemd(own, out_dir=tmp_path / "own")
    text = (tmp_path / "own" / "units" / "autotune-worker.service").read_text()
    assert settings(text, "RuntimeDirectory") == []
    assert 'Environment="VLLM_RPC_BASE_PATH=/srv/rpc"' in text.splitlines()
    # Not an engine that leaves files: nothing added.
    plain = one_service_trial(tmp_path / "c", argv=[PY, "-c", "pass"])
    export_systemd(plain, out_dir=tmp_path / "plain")
    text = (tmp_path / "plain" / "units" / "autotune-worker.service").read_text()
    assert settings(text, "RuntimeDirectory") == []
