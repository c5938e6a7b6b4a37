"""``autotune`` with generated argument lists: exit code 0, 1 or 2, never a traceback, and an
error (exit 2) is a short message; no value is ever run by a shell.

The commands run in-process (typer's CliRunner) in a scratch working directory holding one
real study database (``studies/fuzzstudy.db``, so ``best``/``report``/``apply`` get past
opening the storage) and an assortment of bad files. Nothing long may start: no study file
the fuzzer can name is valid (``run``, ``apply`` and ``restore`` stop at loading it), the
dashboard never gets a storage that opens, and ``bench`` only reaches a closed loopback
port. As a safety net, starting a tuning run, a launcher or the dashboard fails the test.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fuzz_support import EXAMPLE_LIMIT_S, REPO, SOAK_EXAMPLES, budget, time_limit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

sys.path.insert(0, str(REPO / "tests"))
from conftest_results import make_study, typical_specs  # noqa: E402

from autotune.cli import app  # noqa: E402

VALID_STUDY = "fuzzstudy"

# Symbolic values, replaced by paths of the scratch workspace at run time.
CANARY_VALUES = [
    "$(touch @CANARY)",
    "`touch @CANARY`",
    "; touch @CANARY",
    "| touch @CANARY",
    "&& touch @CANARY",
    "\n touch @CANARY",
    "${IFS}touch${IFS}@CANARY",
    "-oProxyCommand=touch @CANARY",
]
STUDIES = st.one_of(
    st.sampled_from(
        [
            VALID_STUDY,
            "dsv4-flash-sim",
            "../x",
            "../../etc/passwd",
            "/abs",
            "a/b",
            "a\x00b",
            "a\nb",
            "x\n",
            "..",
            ".",
            "",
            " ",
            "-x",
            "[/]",
            "[bold]x",
            "é",
            "a" * 101,
            *CANARY_VALUES,
        ]
    ),
    st.text(max_size=8),
)
STORAGES = st.one_of(
    st.sampled_from(
        [
            "sqlite://",
            "sqlite:///:memory:",
            "garbage",
            "",
            "postgresql://u@127.0.0.1:@CLOSED/db",
            "mysql://u@127.0.0.1:@CLOSED/db",
            "oracle://x",
            "http://127.0.0.1:@CLOSED",
            "sqlite:///@ROOT/missing/dir/x.db",
            "sqlite:///@ROOT",
            "sqlite:///@ROOT/notadb.txt",
            "sqlite:///@ROOT/\x00",
            "sqlite:///@VALIDDB",
            "sqlite:///@VALIDDB?timeout=abc",
            "sqlite:///@VALIDDB?mode=ro",
            "sqlite:///../x.db",
            "sqlite:///[/].db",
            "sqlite:///$(touch @CANARY).db",
        ]
    ),
    st.text(max_size=10),
)
NUMBERS = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "3",
            "16",
            "65535",
            "65536",
            "65537",
            "4294967295",
            "4294967296",
            "99999999999999999999",
            "nan",
            "inf",
            "-inf",
            "1e309",
            "0x10",
            "1.5",
            "",
            "abc",
            " 3",
            "\uff13",
        ]
    ),
    st.integers(min_value=-5, max_value=300).map(str),
)
WORDS = st.sampled_from(
    [
        "tpe",
        "random",
        "grid",
        "nsga2",
        "TPE",
        "systemd",
        "env",
        "command",
        "json",
        "completions",
        "chat",
        "",
        "bogus",
        "[/]",
        *CANARY_VALUES,
    ]
)
IN_PATHS = st.sampled_from(
    [
        "@ROOT/missing.yaml",
        "@ROOT/adir",
        "@ROOT/afile",
        "@ROOT/afile/below",
        "@FIFO",
        "/dev/zero",
        "/dev/null",
        "@ROOT/empty.yaml",
        "@ROOT/garbage.bin",
        "@ROOT/broken-study.yaml",
        "@ROOT/list.yaml",
        "@ROOT/bad-space.yaml",
        "@ROOT/\x00x",
        "",
        "-",
        "[/]",
        "studies/../../../x.yaml",
        "@SPACE",
        "@VLLM_SPACE",
        *CANARY_VALUES,
    ]
)
OUT_PATHS = st.sampled_from(
    [
        "@ROOT/out/x",
        "@ROOT/adir",
        "@ROOT/afile",
        "@ROOT/afile/below",
        "@ROOT/new/deep/dir/f.html",
        "out.html",
        "../up.html",
        "@ROOT/\x00x",
        "[/]x.html",
        "@FIFO",
        "/dev/null",
        "",
        "@ROOT/$(touch @CANARY)",
    ]
)
URLS = st.one_of(
    st.sampled_from(
        [
            "http://127.0.0.1:@CLOSED",
            "http://127.0.0.1:@CLOSED/v1",
            "https://127.0.0.1:@CLOSED",
            "http://[::1]:@CLOSED",
            "http://[::1",
            "http://127.0.0.1:99999",
            "http://127.0.0.1:0",
            "http://no-such-host.invalid",
            "ftp://127.0.0.1",
            "127.0.0.1:8000",
            "http://",
            "http:// 127.0.0.1",
            "http://127.0.0.1:@CLOSED/\n",
            "garbage",
            "",
            "http://$(touch @CANARY)",
        ]
    ),
    st.text(max_size=10),
)
HOSTS = st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "", "[/]", "no-such-host.invalid"])
TEXT = st.one_of(st.text(max_size=12), st.sampled_from(CANARY_VALUES))

FLAG = st.none()
"""An option without a value (``--quiet``)."""
SHARED = {"--study": STUDIES, "--storage": STORAGES}
COMMANDS: dict[str, dict[str, st.SearchStrategy[str | None]]] = {
    "run": {
        **SHARED,
        "--trials": NUMBERS,
        "--study-file": IN_PATHS,
        "--sampler": WORDS,
        "--seed": NUMBERS,
        "--quiet": FLAG,
    },
    "best": {**SHARED, "--export": WORDS, "--out": OUT_PATHS},
    "report": {**SHARED, "--out": OUT_PATHS},
    "dashboard": {**SHARED, "--host": HOSTS, "--port": NUMBERS},
    "restore": {"--study": STUDIES, "--study-file": IN_PATHS},
    "apply": {
        **SHARED,
        "--trial": NUMBERS,
        "--best": FLAG,
        "--study-file": IN_PATHS,
    },
    "bench": {
        "--url": URLS,
        "--concurrency": st.sampled_from(["-1", "0", "1", "4", "65537", "1e3", "x"]),
        "--input-len": NUMBERS,
        "--output-len": NUMBERS,
        "--requests": NUMBERS,
        "--duration": NUMBERS,
        "--warmup": NUMBERS,
        "--api": WORDS,
        "--model": TEXT,
        "--records": OUT_PATHS,
        "--json": FLAG,
    },
    "space check": {},
    "plan": {
        **SHARED,
        "--study-file": IN_PATHS,
        "--target-rate": NUMBERS,
        "--headroom": st.one_of(NUMBERS, st.sampled_from(["20%", "0%", "-5%", "1e9%", "%", "x%"])),
        "--gpu-hour-cost": NUMBERS,
        "--per-replica-rate": NUMBERS,
        "--gpus-per-replica": NUMBERS,
        "--top": NUMBERS,
        "--json": FLAG,
        "--no-save": FLAG,
    },
    "init": {
        "--from-command": st.one_of(
            TEXT,
            st.sampled_from(
                [
                    "vllm serve m --max-num-seqs 8",
                    "vllm serve m --max-num-seq 8",
                    "python -m sglang.launch_server --model-path m --port 0",
                    "HF_TOKEN=hf_x vllm serve m --api-key $(touch @CANARY)",
                    "vllm serve 'unterminated",
                ]
            ),
        ),
        "--from-systemd": IN_PATHS,
        "--from-compose": IN_PATHS,
        "--from-k8s": IN_PATHS,
        "--url": URLS,
        "--name": WORDS,
        "--out": OUT_PATHS,
        "--force": FLAG,
        "--concurrency": NUMBERS,
    },
}
STRAYS = st.sampled_from(["--bogus", "-x", "--trials", "--help", "--", "-", "extra", "--study="])


@st.composite
def argv(draw: st.DrawFn) -> list[str]:
    """A command and a random selection of its options (values good and bad), sometimes an
    unknown option, a value missing at the end, or a stray positional."""
    command = draw(st.sampled_from(sorted(COMMANDS)))
    args = command.split()
    options = COMMANDS[command]
    if command == "space check" and draw(st.integers(0, 9)) > 0:
        args.append(draw(IN_PATHS))
    for name in draw(st.lists(st.sampled_from(sorted(options)), max_size=5)) if options else []:
        value = draw(options[name])
        args += [name] if value is None else [name, value]
    if command == "bench" and "--url" not in args and draw(st.booleans()):
        args += ["--url", draw(URLS)]
    if draw(st.integers(0, 4)) == 0:
        args.insert(draw(st.integers(1, len(args))), draw(STRAYS))
    if draw(st.integers(0, 6)) == 0 and options:
        args.append(draw(st.sampled_from(sorted(options))))  # its value is missing
    return args


# --------------------------------------------------------------------------- workspace
@dataclass
class Workspace:
    root: Path
    cwd: Path
    canary: Path
    closed_port: int

    def resolve(self, arg: str, *, command: str) -> str:
        valid_db = self.cwd / "studies" / f"{VALID_STUDY}.db"
        if command == "dashboard":  # never a storage that opens: the server would block
            arg = arg.replace(VALID_STUDY, "no-such-study").replace("@VALIDDB", "@ROOT/none.db")
        return (
            arg.replace("@CANARY", str(self.canary))
            .replace("@VALIDDB", str(valid_db))
            .replace("@FIFO", str(self.root / "fifo"))
            .replace("@ROOT", str(self.root))
            .replace("@CLOSED", str(self.closed_port))
            .replace("@SPACE", str(REPO / "search_spaces" / "dsv4-flash-rtx6000-pd.yaml"))
            .replace("@VLLM_SPACE", str(REPO / "search_spaces" / "vllm-cpu.yaml"))
        )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _forbidden(what: str) -> object:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the CLI fuzz must never start {what}")

    return refuse


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    root = tmp_path_factory.mktemp("cli-fuzz")
    cwd = root / "a" / "b" / "work"  # '../' twice stays inside root
    (cwd / "studies").mkdir(parents=True)
    make_study(cwd / "studies", typical_specs(6), name=VALID_STUDY)
    (cwd / "studies" / "study.db").rename(cwd / "studies" / f"{VALID_STUDY}.db")
    (root / "adir").mkdir()
    (root / "afile").write_text("x")
    (root / "empty.yaml").write_text("")
    (root / "garbage.bin").write_bytes(bytes(range(256)))
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "notadb.txt").write_text("this is not a database\n")
    (root / "bad-space.yaml").write_text("name: x\nservices: [a]\nparameters: {p: {type: 1}}\n")
    (root / "broken-study.yaml").write_text(
        "name: broken\n"
        f"space: {REPO / 'search_spaces' / 'dsv4-flash-rtx6000-pd.yaml'}\n"
        f"deployment: {root / 'no-such-deployment.yaml'}\n"
    )
    os.mkfifo(root / "fifo")
    patches = pytest.MonkeyPatch()
    patches.setattr("autotune.study.runner.Tuner.run", _forbidden("a tuning run"))
    patches.setattr("autotune.study.runner.make_launcher", _forbidden("a launcher"))
    patches.setattr("autotune.launch.factory.make_launcher", _forbidden("a launcher"))
    patches.setattr("autotune.dashboard.serve_dashboard", _forbidden("the dashboard"))
    patches.chdir(cwd)
    try:
        yield Workspace(root, cwd, root / "CANARY", _closed_port())
    finally:
        patches.undo()
        shutil.rmtree(root, ignore_errors=True)


RUNNER = CliRunner()


def check_cli(workspace: Workspace, args: list[str]) -> None:
    command = " ".join(args[:2]) if args[:2] == ["space", "check"] else args[0]
    real = [workspace.resolve(a, command=command) for a in args]
    with time_limit(EXAMPLE_LIMIT_S):
        result = RUNNER.invoke(app, real)
    output = result.output
    shown = f"autotune {real!r} -> {result.exit_code}\n{output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{shown}\n{result.exception!r}"
    )
    assert result.exit_code in (0, 1, 2), shown
    assert "Traceback" not in output, shown
    if result.exit_code == 2 and "Commands" not in output:  # not the bare help screen
        lines = output.strip().splitlines()
        assert 0 < len(lines) <= 10, shown
    assert not workspace.canary.exists(), shown


_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@settings(max_examples=budget(150), **_SETTINGS)  # type: ignore[arg-type]
@given(args=argv())
def test_cli_arguments(workspace: Workspace, args: list[str]) -> None:
    check_cli(workspace, args)


@pytest.mark.soak
@settings(max_examples=SOAK_EXAMPLES, **_SETTINGS)  # type: ignore[arg-type]
@given(args=argv())
def test_cli_arguments_soak(workspace: Workspace, args: list[str]) -> None:
    check_cli(workspace, args)


@pytest.mark.parametrize(
    "args",
    [
        ["best", "--study", VALID_STUDY],
        ["best", "--study", VALID_STUDY, "--export", "json", "--out", "@ROOT/out"],
        ["report", "--study", VALID_STUDY, "--out", "@ROOT/r.html"],
        ["space", "check", "@SPACE"],
    ],
)
def test_workspace_reaches_past_validation(workspace: Workspace, args: list[str]) -> None:
    """The scratch study is real: commands given good arguments succeed (exit 0), so the
    fuzz exercises what follows a valid --study/--storage, not only their refusal."""
    result = RUNNER.invoke(app, [workspace.resolve(a, command=args[0]) for a in args])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["report", "--study", VALID_STUDY, "--out", "@ROOT/adir"], "field '--out'"),
        (["report", "--study", VALID_STUDY, "--out", "@FIFO"], "not a regular file"),  # hung
        (["best", "--study", VALID_STUDY, "--export", "json", "--out", "@ROOT/afile"], "--out"),
        (["bench", "--url", "http://[::1"], "field '--url'"),
        (["bench", "--url", "http://127.0.0.1:99999"], "field '--url'"),
        (["bench", "--url", "http://127.0.0.1:@CLOSED", "--duration", "inf"], "--duration"),
        (["space", "check", "@FIFO"], "not a regular file"),
        (["space", "check", "/dev/zero"], "not a regular file"),
        (["space", "check", "[/]"], "[/]"),
        (["run", "--study", "[/x]"], "[/x]"),
        (["restore", "--study", "../../etc/passwd"], "field '--study'"),
        (["run", "--seed", "4294967296"], "--seed"),
    ],
)
def test_found_by_the_fuzz(workspace: Workspace, args: list[str], needle: str) -> None:
    """Inputs the fuzz found that used to end in a traceback (or hang): now one error."""
    result = RUNNER.invoke(app, [workspace.resolve(a, command=args[0]) for a in args])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert needle in result.output, result.output
