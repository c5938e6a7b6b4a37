"""The harness's children: each in its own session, output teed to a log; this process is a
child subreaper, so whatever they leave behind (a server a child lost track of) stays its
descendant and is stopped on exit, on Ctrl-C and on SIGTERM."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from autotune.launch.local import LocalLauncher

from . import REPO


def _ppid_map() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z":
            out[int(name)] = int(fields[1])
    return out


def descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, parents first."""
    parents = _ppid_map()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Processes:
    """Children of this script: each in its own session, output teed to a log file; on
    exit every descendant left (a server a child lost track of included) is stopped."""

    def __init__(self) -> None:
        self.current: subprocess.Popen[bytes] | None = None
        self.launchers: list[LocalLauncher] = []
        with contextlib.suppress(Exception):  # PR_SET_CHILD_SUBREAPER: orphans stay ours
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)

    def run(
        self,
        cmd: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        echo: Callable[[str], bool] = lambda line: True,
    ) -> int:
        """Run ``cmd`` to its end (from the project root); Ctrl-C is forwarded to it once."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as fh:
            fh.write(f"\n=== {time.strftime('%H:%M:%S')} {shlex.join(cmd)}\n".encode())
        proc = subprocess.Popen(
            list(cmd),
            cwd=REPO,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.current = proc

        def tee() -> None:
            # Owns its file: a server the child left behind may hold the pipe open.
            assert proc.stdout is not None
            with log.open("ab") as fh:
                for raw in proc.stdout:
                    fh.write(raw)
                    fh.flush()
                    line = raw.decode(errors="replace").rstrip()
                    if echo(line):
                        print(f"    {line}", flush=True)

        reader = threading.Thread(target=tee, daemon=True)
        reader.start()
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            self._interrupt(proc)
            raise
        finally:
            reader.join(timeout=5)
            self.current = None
        return rc

    def _interrupt(self, proc: subprocess.Popen[bytes], wait_s: float = 60.0) -> None:
        """One SIGINT to the child's process group (autotune run then stops its services,
        the sweep kills its server), then SIGKILL if it does not exit."""
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def launcher(self, run_dir: Path) -> LocalLauncher:
        launcher = LocalLauncher(run_dir=run_dir)
        self.launchers.append(launcher)
        return launcher

    def release(self, launcher: LocalLauncher) -> None:
        launcher.stop_all()
        launcher.close()
        self.launchers.remove(launcher)

    def cleanup(self) -> None:
        """Stop everything this script started that still runs."""
        if self.current is not None:
            self._interrupt(self.current)
        for launcher in list(self.launchers):
            with contextlib.suppress(Exception):
                self.release(launcher)
        left = descendants(os.getpid())
        if not left:
            return
        print(f"stopping {len(left)} leftover process(es): {left}", flush=True)
        own_group = os.getpgrp()
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    group = os.getpgid(pid)
                    if group != own_group:
                        os.killpg(group, sig)
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    while os.waitpid(-1, os.WNOHANG)[0] > 0:  # reap adopted orphans
                        pass
                left = [p for p in left if p in _ppid_map()]
                if not left:
                    return
                time.sleep(0.2)


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
