"""A small, real stand-in for systemd's service handling (``systemctl``, ``journalctl``).

It runs services for real: ``daemon-reload`` parses the unit files and drop-ins of
``$FAKE_SYSTEMD_UNIT_DIR`` into a "loaded" configuration, and ``start``/``restart`` run that
configuration's ``ExecStart=`` as a detached process group with the merged ``Environment=``
minus ``UnsetEnvironment=`` (on a clean environment, like systemd), its output appended to
a per-invocation journal file under ``$FAKE_SYSTEMD_STATE_DIR``.

Like systemd, a unit that was loaded keeps its loaded configuration until ``daemon-reload``
(a changed drop-in is not used before), an empty ``ExecStart=``/``Environment=`` resets the
list, ``Type=simple`` with more than one ``ExecStart=`` is a bad setting, ``%%`` is the only
``%`` escape accepted in values (an unknown specifier is a bad setting), ``$$``/``${VAR}``/
``$VAR`` are substituted in ``ExecStart=`` only, and quoting follows systemd.syntax(7).
``RuntimeDirectory=`` is made (``RuntimeDirectoryMode=``) under the fake's runtime directory,
``%t`` (``$FAKE_SYSTEMD_STATE_DIR/runtime``; systemd's ``/run``), afresh at each start, and
removed once the unit's processes are gone: systemd does it when the unit stops, the fake (no
daemon) the next time it looks at the unit.

Written from systemd.syntax(7), systemd.service(5) and systemd.exec(5) for the tests, not
from autotune's code (the escaping it checks is autotune's).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STOP_TIMEOUT_S = 5.0


class BadSetting(Exception):
    pass


# --------------------------------------------------------------------------- paths
def unit_dir() -> Path:
    return Path(os.environ["FAKE_SYSTEMD_UNIT_DIR"])


def state_dir() -> Path:
    path = Path(os.environ["FAKE_SYSTEMD_STATE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def _json_file(kind: str, unit: str) -> Path:
    path = state_dir() / kind / f"{unit}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- parsing
def read_settings(paths: list[Path]) -> list[tuple[str, str, str]]:
    """(section, key, raw value) in file order; comments, continuations as in systemd."""
    out: list[tuple[str, str, str]] = []
    for path in paths:
        section = ""
        pending = ""
        for raw in path.read_text().splitlines():
            line = pending + raw
            pending = ""
            stripped = line.strip()
            if not stripped or stripped[0] in "#;":
                continue
            if stripped.endswith("\\") and not stripped.endswith("\\\\"):
                pending = stripped[:-1] + " "
                continue
            if stripped.startswith("[") and stripped.endswith("]"):
                section = stripped[1:-1]
                continue
            key, sep, value = stripped.partition("=")
            if not sep:
                raise BadSetting(f"{path}: not a key=value line: {raw!r}")
            out.append((section, key.strip(), value.strip()))
    return out


_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "t": "\t", "n": "\n", "s": " ", "a": "\a"}


def split_words(text: str) -> list[str]:
    """Whitespace-separated words; "..." and '...' quote, C escapes apply (systemd.syntax)."""
    words: list[str] = []
    cur: list[str] = []
    in_word = False
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            i += 1
            if i >= len(text):
                raise BadSetting(f"trailing backslash in {text!r}")
            esc = text[i]
            if esc == "x":
                cur.append(chr(int(text[i + 1 : i + 3], 16)))
                i += 2
            elif esc in _ESCAPES:
                cur.append(_ESCAPES[esc])
            else:
                raise BadSetting(f"invalid escape \\{esc} in {text!r}")
            in_word = True
        elif quote:
            if c == quote:
                quote = ""
            else:
                cur.append(c)
        elif c in "\"'":
            quote = c
            in_word = True
        elif c.isspace():
            if in_word:
                words.append("".join(cur))
                cur, in_word = [], False
        else:
            cur.append(c)
            in_word = True
        i += 1
    if quote:
        raise BadSetting(f"unbalanced quotes in {text!r}")
    if in_word:
        words.append("".join(cur))
    return words


def runtime_root() -> Path:
    """``%t``: where ``RuntimeDirectory=`` directories are made."""
    return state_dir() / "runtime"


def specifiers(word: str, unit: str) -> str:
    """``%%`` -> ``%``, ``%n``/``%N`` the unit name, ``%t`` the runtime directory; any other
    specifier is an error."""

    def repl(m: re.Match[str]) -> str:
        spec = m.group(1)
        if spec == "%":
            return "%"
        if spec == "n":
            return unit
        if spec == "N":
            return unit.rsplit(".", 1)[0]
        if spec == "t":
            return str(runtime_root())
        raise BadSetting(f"unsupported specifier %{spec} in {word!r}")

    return re.sub(r"%(.)", repl, word)


def expand_exec(words: list[str], env: dict[str, str]) -> list[str]:
    """``$$`` -> ``$``, ``${VAR}`` inside a word, ``$VAR`` as a whole word splits."""
    out: list[str] = []
    for word in words:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            out += env.get(m.group(1), "").split()
            continue

        def repl(mm: re.Match[str]) -> str:
            if mm.group(0) == "$$":
                return "$"
            return env.get(mm.group(1), "")

        out.append(re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", repl, word))
    return out


def load_unit(unit: str) -> dict[str, Any]:
    """The merged configuration of ``unit`` from its file and ``UNIT.d/*.conf`` drop-ins."""
    fragment = unit_dir() / unit
    if not fragment.is_file():
        return {"load_state": "not-found", "error": f"Unit {unit} not found."}
    dropins = sorted((unit_dir() / f"{unit}.d").glob("*.conf"))
    cfg: dict[str, Any] = {
        "load_state": "loaded",
        "exec": [],
        "env": {},
        "unset": [],
        "workdir": None,
        "runtime_dirs": [],
        "runtime_mode": "0755",
        "type": "simple",
        "timeout_stop": STOP_TIMEOUT_S,
        "dropins": [str(p) for p in dropins],
    }
    try:
        for section, key, value in read_settings([fragment, *dropins]):
            if section != "Service":
                continue
            if key == "ExecStart":
                if not value:
                    cfg["exec"] = []
                    continue
                words = [specifiers(w, unit) for w in split_words(value)]
                words[0] = words[0].lstrip("-@:+!")
                if not words[0].startswith("/"):
                    raise BadSetting(f"ExecStart= executable is not an absolute path: {words[0]}")
                cfg["exec"].append(words)
            elif key == "Environment":
                if not value:
                    cfg["env"] = {}
                for word in split_words(value):
                    name, sep, val = specifiers(word, unit).partition("=")
                    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                        raise BadSetting(f"invalid environment assignment {word!r}")
                    cfg["env"][name] = val
            elif key == "UnsetEnvironment":
                if not value:
                    cfg["unset"] = []
                cfg["unset"] += [specifiers(w, unit) for w in split_words(value)]
            elif key == "RuntimeDirectory":
                if not value:
                    cfg["runtime_dirs"] = []
                for word in split_words(value):
                    word = specifiers(word, unit)
                    if word.startswith("/") or ".." in word.split("/"):
                        raise BadSetting(f"RuntimeDirectory= path is not relative: {word!r}")
                    cfg["runtime_dirs"].append(word)
            elif key == "RuntimeDirectoryMode":
                if not re.fullmatch(r"0?[0-7]{3,4}", value):
                    raise BadSetting(f"invalid RuntimeDirectoryMode= {value!r}")
                cfg["runtime_mode"] = value
            elif key == "WorkingDirectory":
                cfg["workdir"] = specifiers(value, unit).lstrip("-") or None
            elif key == "Type":
                cfg["type"] = value
            elif key == "TimeoutStopSec":
                cfg["timeout_stop"] = float(value.rstrip("s") or 0)
        if cfg["type"] in ("simple", "exec", "notify") and len(cfg["exec"]) != 1:
            raise BadSetting(
                "Service has more than one ExecStart= setting, which is only allowed for "
                "Type=oneshot services. Refusing."
                if cfg["exec"]
                else "Service has no ExecStart= setting. Refusing."
            )
    except BadSetting as exc:
        return {"load_state": "bad-setting", "error": str(exc)}
    return cfg


def loaded(unit: str) -> dict[str, Any]:
    """The loaded configuration (loaded from disk on first use, like systemd)."""
    path = _json_file("loaded", unit)
    cfg = _read_json(path)
    if cfg is None:
        cfg = load_unit(unit)
        if cfg["load_state"] != "not-found":
            _write_json(path, cfg)
    return cfg


def daemon_reload() -> None:
    for path in (state_dir() / "loaded").glob("*.json"):
        path.unlink()
    for fragment in sorted(unit_dir().glob("*.service")):
        _write_json(_json_file("loaded", fragment.name), load_unit(fragment.name))


# --------------------------------------------------------------------------- runtime
def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


def runtime(unit: str) -> dict[str, Any]:
    return _read_json(_json_file("run", unit)) or {}


def active_state(unit: str) -> str:
    rt = runtime(unit)
    pid = rt.get("pid")
    if pid and _group_alive(int(pid)):
        return "deactivating" if rt.get("stopping") else "active"
    _remove_runtime_dirs(loaded(unit))  # the unit has ended: systemd would have by now
    if not pid:
        return "inactive"
    try:
        rc = int(Path(rt["rc_file"]).read_text().strip())
    except (OSError, ValueError, KeyError):
        return "inactive"  # killed by a signal: stopped
    return "failed" if rc != 0 and not rt.get("stopping") else "inactive"


def start(unit: str) -> int:
    cfg = loaded(unit)
    if cfg["load_state"] == "not-found":
        print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
        return 5
    if cfg["load_state"] != "loaded":
        print(
            f"Failed to start {unit}: Unit {unit} has a bad unit file setting. "
            f"({cfg.get('error')})",
            file=sys.stderr,
        )
        return 1
    if active_state(unit) in ("active", "deactivating"):
        return 0
    invocation = uuid.uuid4().hex
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "INVOCATION_ID": invocation}
    env.update(cfg["env"])
    for name in cfg["unset"]:
        key, sep, value = name.partition("=")
        if not sep or env.get(key) == value:
            env.pop(key, None)
    argv = expand_exec(cfg["exec"][0], env)
    _remove_runtime_dirs(cfg)
    for rel in cfg.get("runtime_dirs", []):
        path = runtime_root() / rel
        path.mkdir(parents=True)
        path.chmod(int(cfg.get("runtime_mode", "0755"), 8))
    journal_dir = state_dir() / "journal" / unit
    journal_dir.mkdir(parents=True, exist_ok=True)
    seq = len(list(journal_dir.glob("*.log")))
    journal = journal_dir / f"{seq:06d}-{invocation}.log"
    rc_file = state_dir() / "run" / f"{unit}.{invocation}.rc"
    workdir = cfg["workdir"]
    if workdir == "~":
        workdir = os.path.expanduser("~")
    # The leader records the exit status (systemd knows it as the main process's parent).
    wrapper = ["/bin/sh", "-c", 'rc=$1; shift; "$@"; echo $? > "$rc"', "fake-systemd", str(rc_file)]
    with open(journal, "ab") as out:
        try:
            proc = subprocess.Popen(
                [*wrapper, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
                start_new_session=True,
            )
        except OSError as exc:
            print(f"Failed to start {unit}: {exc}", file=sys.stderr)
            return 1
    _write_json(
        _json_file("run", unit),
        {
            "pid": proc.pid,
            "invocation_id": invocation,
            "journal": str(journal),
            "rc_file": str(rc_file),
            "stopping": False,
            "argv": argv,
        },
    )
    return 0


def send(unit: str, sig: int) -> None:
    pid = runtime(unit).get("pid")
    if pid and _group_alive(int(pid)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), sig)


def stop(unit: str, *, block: bool) -> int:
    rt = runtime(unit)
    pid = rt.get("pid")
    if not pid or not _group_alive(int(pid)):
        _remove_runtime_dirs(loaded(unit))  # ended on its own: systemd would have by now
        return 0
    rt["stopping"] = True
    _write_json(_json_file("run", unit), rt)
    send(unit, signal.SIGTERM)
    if not block:
        return 0
    timeout = float(loaded(unit).get("timeout_stop", STOP_TIMEOUT_S))
    deadline = time.monotonic() + timeout
    while _group_alive(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _group_alive(int(pid)):
        send(unit, signal.SIGKILL)
        while _group_alive(int(pid)):
            time.sleep(0.02)
    _remove_runtime_dirs(loaded(unit))
    return 0


def _remove_runtime_dirs(cfg: dict[str, Any]) -> None:
    for rel in cfg.get("runtime_dirs", []):
        shutil.rmtree(runtime_root() / rel, ignore_errors=True)


# --------------------------------------------------------------------------- CLIs
def systemctl_main(argv: list[str]) -> int:
    flags = {a for a in argv if a.startswith("--") and "=" not in a}
    props: list[str] = []
    sig: int = signal.SIGTERM
    args: list[str] = []
    it = iter(argv)
    for a in it:
        if a in ("-p", "--property"):
            props += next(it).split(",")
        elif a.startswith("--property="):
            props += a.split("=", 1)[1].split(",")
        elif a in ("-s", "--signal"):
            sig = _signal(next(it))
        elif a.startswith("--signal="):
            sig = _signal(a.split("=", 1)[1])
        elif a.startswith("-"):
            continue
        else:
            args.append(a)
    if not args:
        print("fake systemctl: no command", file=sys.stderr)
        return 1
    cmd, units = args[0], args[1:]
    if cmd == "daemon-reload":
        daemon_reload()
        return 0
    rc = 0
    for unit in units:
        if cmd == "start":
            rc = rc or start(unit)
        elif cmd == "stop":
            rc = rc or stop(unit, block="--no-block" not in flags)
        elif cmd == "restart":
            if loaded(unit)["load_state"] == "loaded":
                stop(unit, block=True)
            rc = rc or start(unit)
        elif cmd == "kill":
            send(unit, sig)
        elif cmd == "is-active":
            state = active_state(unit)
            print(state)
            rc = rc or (0 if state == "active" else 3)
        elif cmd == "show":
            values = _show(unit)
            for p in props or sorted(values):
                value = values.get(p, "")
                print(value if "--value" in flags else f"{p}={value}")
        else:
            print(f"fake systemctl: unsupported command {cmd}", file=sys.stderr)
            return 1
    return rc


def _signal(name: str) -> int:
    name = name.upper()
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


def _show(unit: str) -> dict[str, str]:
    cfg = loaded(unit)
    rt = runtime(unit)
    state = active_state(unit)
    pid = rt.get("pid") if state in ("active", "deactivating") else 0
    sub = {"active": "running", "deactivating": "stop-sigterm", "failed": "failed"}
    return {
        "LoadState": str(cfg["load_state"]),
        "ActiveState": state,
        "SubState": sub.get(state, "dead"),
        "MainPID": str(pid or 0),
        "InvocationID": str(rt.get("invocation_id", "")),
        "FragmentPath": str(unit_dir() / unit) if cfg["load_state"] != "not-found" else "",
        "DropInPaths": " ".join(cfg.get("dropins", [])),
    }


def journalctl_main(argv: list[str]) -> int:
    unit = None
    invocation = None
    lines: int | None = None
    quiet = False
    it = iter(argv)
    for a in it:
        if a in ("-u", "--unit"):
            unit = next(it)
        elif a.startswith("--unit="):
            unit = a.split("=", 1)[1]
        elif a in ("-n", "--lines"):
            lines = int(next(it))
        elif a.startswith("--lines="):
            lines = int(a.split("=", 1)[1])
        elif a in ("-o", "--output"):
            if next(it) != "cat":
                print("fake journalctl: only -o cat", file=sys.stderr)
                return 1
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a.startswith("_SYSTEMD_INVOCATION_ID="):
            invocation = a.split("=", 1)[1]
        elif a in ("--no-pager",) or a.startswith("--output="):
            continue
        else:
            print(f"fake journalctl: unsupported argument {a}", file=sys.stderr)
            return 1
    root = state_dir() / "journal"
    if invocation is not None:
        files = sorted(root.glob(f"*/*-{invocation}.log"))
        if unit is not None:
            files = [f for f in files if f.parent.name == unit]
    elif unit is not None:
        files = sorted((root / unit).glob("*.log"))
    else:
        files = sorted(root.glob("*/*.log"))
    text = "".join(f.read_bytes().decode(errors="replace") for f in files)
    out = text.splitlines()
    if lines is not None:
        out = out[-lines:] if lines > 0 else []
    if not out and not quiet:
        print("-- No entries --")
    for line in out:
        print(line)
    return 0
