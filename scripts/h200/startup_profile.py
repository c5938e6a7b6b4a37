"""Where a vLLM start goes, from py-spy's raw stacks (``run.sh profile``).

A restart costs 50-140 s on the GPU machine, and the stages vLLM logs leave 40-50 s of it
unexplained: 19-27 s from the process start to the model's architecture being resolved, and
17-27 s more before the engine core logs its first line (BENCHMARKS.md, "Where a restart goes
on the H200"). ``run.sh profile`` records one start under ``py-spy record --subprocesses
--idle --threads --format raw``; this script reads those stacks (gzip or plain) and says, per
process, how many seconds its main thread spent importing which package, in which functions
(inclusive) and on which innermost lines (what it waited on: a lock, a socket, a child), so
the next step is a measured one, not a guess.

py-spy's raw format is one record per distinct stack: ``process PID:"CMD";[process
PID:"CMD";]thread (TID)[: NAME];frame;...;frame COUNT``, the outer ``process`` entries being
the parents of a child process; a CMD is written unescaped, newlines included, so a record
may span lines. A sample of the main thread (TID == PID) is 1/rate seconds of that process's
wall clock (``--idle`` keeps the waiting ones); other threads are left out. The stacks carry
no time: ``--procs-of PID``, run as the server first listens, reads from the kernel when it
and every process under it started, and ``--procs`` puts that beside each process.

    python3 scripts/h200/startup_profile.py --procs-of SERVER_PID > startup-profile.procs
    python3 scripts/h200/startup_profile.py startup-profile.raw.gz --rate 20 [--top 15] \
        [--procs startup-profile.procs]
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# run.sh puts the checkout on PYTHONPATH; the tests run in the project's environment
from autotune.remote.managers.hostops import parse_stat

# A command line is written as it is: quotes and newlines unescaped (``python -c`` children of
# torch's inductor carry both), so it ends at the `";` before the next process or the thread.
_PROCESS = re.compile(r'process (\d+):"(.*?)";(?=process \d+:"|thread \()', re.S)
_RECORD = re.compile(r'process \d+:"|thread \(')
_THREAD = re.compile(r"thread \((\d+)\)(?:: ([^;]*))?(?:;|$)")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::\d+)?\)$")
_IMPORT = "_find_and_load"


@dataclass(frozen=True)
class Stack:
    """One line of the raw profile: a main-thread stack, outermost frame first."""

    pid: int
    cmd: str
    frames: tuple[str, ...]
    count: int
    parent: int | None = None


@dataclass
class Process:
    """What one process's main thread did, in samples."""

    pid: int
    cmd: str
    parent: int | None = None
    samples: int = 0
    no_frames: int = 0  # the interpreter before any Python frame (start-up, exit)
    imports: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    leaves: Counter[str] = field(default_factory=Counter)


def read_lines(path: Path) -> Iterator[str]:
    """The records of a raw file: a command line with newlines spans several lines of it, and
    a record begins only where a line begins with a process or a thread."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from records(line.rstrip("\n") for line in f)


def records(lines: Iterable[str]) -> Iterator[str]:
    """Physical lines joined into py-spy records (see :func:`read_lines`)."""
    record: str | None = None
    for line in lines:
        if _RECORD.match(line):
            if record is not None:
                yield record
            record = line
        elif record is not None:
            record += "\n" + line
        elif line.strip():
            yield line  # not a record's start: parse() says what it is
    if record is not None:
        yield record


def parse(lines: Iterable[str]) -> Iterator[Stack]:
    """The main-thread stacks of ``lines`` (other threads' are skipped)."""
    for line in lines:
        body, _, count = line.rpartition(" ")
        if not count.isdigit():
            raise ValueError(f"not a py-spy raw line (no sample count at its end): {line[:120]}")
        pos, pid, cmd, parent = 0, None, "", None
        while (m := _PROCESS.match(body, pos)) is not None:
            parent, pid, cmd, pos = pid, int(m.group(1)), m.group(2), m.end()
        thread = _THREAD.match(body, pos)
        if pid is None or thread is None:
            raise ValueError(f"not a py-spy raw line of --subprocesses --threads: {line[:120]}")
        if int(thread.group(1)) != pid:  # on Linux the main thread's id is the pid
            continue
        rest = body[thread.end() :]
        frames = tuple(f for f in rest.split(";") if f) if rest else ()
        yield Stack(pid, cmd, frames, int(count), parent)


def process_tree(root: int, proc: Path = Path("/proc")) -> list[tuple[int, float, str]]:
    """(pid, seconds after ``root`` started, command line) of ``root`` and every descendant
    alive now, from the kernel's start times (``/proc/PID/stat`` field 22, in clock ticks).

    py-spy's raw stacks carry no time; taken when the server first listens, this says when
    the engine core and its children started (those that already ended are not there)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: list[tuple[int, float, str]] = []
    todo, start0 = [root], None
    while todo:
        pid = todo.pop(0)
        try:
            stat = (proc / str(pid) / "stat").read_text()
            cmd = (proc / str(pid) / "cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ")
            children = [
                int(c)
                for task in (proc / str(pid) / "task").iterdir()
                for c in (task / "children").read_text().split()
            ]
        except (OSError, ValueError):
            continue  # ended meanwhile
        info = parse_stat(pid, stat.rsplit(")", 1)[1])  # what follows "(comm)"
        if info is None or info.start_ticks is None:
            continue
        started = info.start_ticks
        start0 = started if start0 is None else start0
        out.append((pid, (started - start0) / tick, cmd.decode(errors="replace")))
        todo.extend(sorted(children))
    return out


def read_procs(path: Path) -> dict[int, float]:
    """pid -> seconds after the server started, from a file of :func:`main`'s --procs-of."""
    out: dict[int, float] = {}
    for line in path.read_text().splitlines():
        pid, at, _ = line.split("\t", 2)
        out[int(pid)] = float(at)
    return out


def _where(frame: str) -> tuple[str, str] | None:
    """(function, file) of a frame in a package (not a frozen importlib one)."""
    m = _FRAME.match(frame)
    if m is None or m.group("file").startswith("<"):
        return None
    return m.group("func"), m.group("file")


def _imported(frames: tuple[str, ...], wheres: list[tuple[str, str] | None]) -> str | None:
    """The top-level package whose import this stack is in (the first module executed below
    the outermost import), or None when it imports nothing. ``wheres``: :func:`_where` of
    each frame."""
    for i, frame in enumerate(frames):
        if frame.startswith(_IMPORT):
            for where in wheres[i + 1 :]:
                if where is not None and where[0] == "<module>":
                    return where[1].split("/")[0].removesuffix(".py")
            return "?"
    return None


def summarize(stacks: Iterable[Stack]) -> list[Process]:
    out: dict[int, Process] = {}
    for s in stacks:
        proc = out.setdefault(s.pid, Process(s.pid, s.cmd, s.parent))
        proc.samples += s.count
        if not s.frames:
            proc.no_frames += s.count
            continue
        wheres = [_where(frame) for frame in s.frames]
        package = _imported(s.frames, wheres)
        if package is not None:
            proc.imports[package] += s.count
        keys = {f"{w[0]} ({w[1]})" for w in wheres if w is not None and w[0] != "<module>"}
        for key in keys:  # inclusive: once per sample, however deep it recurses
            proc.inclusive[key] += s.count
        proc.leaves[s.frames[-1]] += s.count
    return sorted(out.values(), key=lambda p: p.pid)


def markdown(
    processes: list[Process], *, rate: float, top: int, started: dict[int, float] | None = None
) -> str:
    def sec(n: int) -> str:
        return f"{n / rate:.1f}"

    def one_line(cmd: str, width: int) -> str:  # `python -c` code spans lines
        return cmd.replace("\n", "\\n").replace("`", "'").replace("|", "\\|")[:width]

    lines = [
        f"# Where the start went (py-spy, {rate:g} samples/s, main threads)",
        "",
        "Each process's main thread, sampled from its start (or py-spy finding it) to its exit or",
        "the stop. Started: seconds after the server's start, read from the kernel when the",
        "server first listened (blank: it had ended by then, or no reading was taken).",
        "",
        "| pid | parent | started, s | s sampled | s importing | command |",
        "|---:|---:|---:|---:|---:|---|",
        *(
            f"| {p.pid} | {p.parent or ''} | {_at(started, p.pid)} | {sec(p.samples)} "
            f"| {sec(sum(p.imports.values()))} | `{one_line(p.cmd, 90)}` |"
            for p in processes
        ),
        "",
    ]
    for p in processes:
        imported = sum(p.imports.values())
        lines += [
            f"## pid {p.pid}: {sec(p.samples)} s",
            "",
            f"`{one_line(p.cmd, 200)}`",
            "",
            f"Importing modules {sec(imported)} s; before the first Python frame or after the "
            f"last {sec(p.no_frames)} s.",
            "",
            "| package imported | s |",
            "|---|---:|",
            *(f"| {k} | {sec(v)} |" for k, v in p.imports.most_common(top)),
            "",
            "| function (inclusive, imports included) | s |",
            "|---|---:|",
            *(f"| `{k}` | {sec(v)} |" for k, v in p.inclusive.most_common(top)),
            "",
            "| innermost frame (where it ran or waited) | s |",
            "|---|---:|",
            *(f"| `{k}` | {sec(v)} |" for k, v in p.leaves.most_common(top)),
            "",
        ]
    return "\n".join(lines)


def _at(started: dict[int, float] | None, pid: int) -> str:
    at = (started or {}).get(pid)
    return "" if at is None else f"{at:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, nargs="?", help="py-spy's --format raw (.gz too)")
    parser.add_argument("--rate", type=float, default=20.0, help="py-spy's --rate")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--procs", type=Path, help="a file of --procs-of: when each started")
    parser.add_argument(
        "--procs-of", type=int, metavar="PID", help="print PID's process tree with start times"
    )
    args = parser.parse_args(argv)
    if args.procs_of is not None:
        for pid, at, cmd in process_tree(args.procs_of):
            print(f"{pid}\t{at:.2f}\t{cmd}")
        return 0
    if args.raw is None:
        parser.error("the raw profile is required (or --procs-of PID)")
    try:
        processes = summarize(parse(read_lines(args.raw)))
    except (OSError, ValueError) as exc:
        print(f"{args.raw}: {exc}", file=sys.stderr)
        return 1
    try:
        started = read_procs(args.procs) if args.procs else None
    except (OSError, ValueError) as exc:
        print(
            f"{args.procs}: not a file of --procs-of (PID, seconds, command): {exc}",
            file=sys.stderr,
        )
        return 1
    if not processes:
        print(f"{args.raw}: no main-thread samples", file=sys.stderr)
        return 1
    print(markdown(processes, rate=args.rate, top=args.top, started=started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
