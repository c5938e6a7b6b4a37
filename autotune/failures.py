"""Every failure class a trial can store, and how a start-up failure is read from a log.

A failed trial teaches the sampler only if the reason is kept and means the same thing
everywhere: an OOM says "less memory", a rejected flag says "forbidden combination", an NCCL
hang says "transport". :class:`Failure` lists every class the project stores (the launcher
classifies start-up failures from the logs, the trial pipeline adds what happens after a
healthy start, the study loop what is not about the configuration at all); readers compare
against these values, never against string literals. The log patterns below are real
messages from PyTorch, NCCL, SGLang, Hugging Face and uvicorn.

This sits below the launcher and the service managers (both raise errors with a failure
class), above only the engines whose own patterns it merges.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from enum import Enum
from typing import NamedTuple

from autotune.engines import all_failure_patterns, all_start_stages


class Failure(str, Enum):
    """``failure`` of a stored trial; ``None`` there means it was measured."""

    # Start-up, classified from the service's log (launch/classify.py).
    cuda_oom = "cuda_oom"
    nccl_error = "nccl_error"
    port_in_use = "port_in_use"
    model_path_missing = "model_path_missing"
    cuda_error = "cuda_error"
    config_rejected = "config_rejected"
    readiness_timeout = "readiness_timeout"
    exited = "exited"
    unknown = "unknown"
    # After a healthy start (the trial pipeline).
    crashed = "crashed"
    """The service was healthy, then died while it was being measured (no known cause)."""
    trial_timeout = "trial_timeout"
    """The trial's deadline (``trial_timeout_s`` of the study) passed."""
    compile_timeout = "compile_timeout"
    """The server was healthy but still compiling (torch.compile) when the warm-up or the
    trial ran out of time: a lever that costs more start-up than a trial can give it."""
    wrong_output = "wrong_output"
    """The greedy correctness probe's text differs from the reference."""
    bench_failed = "bench_failed"
    """The load generator could not produce a measurement."""
    request_errors = "request_errors"
    """More requests failed than the SLO's ``max_error_rate`` allows (metrics kept)."""
    no_telemetry = "no_telemetry"
    """The objective needs the GPUs' energy per output token and the measured phase has
    none (no NVML or GPU here, services on another host, no energy reading); metrics kept."""
    forbidden = "forbidden"
    """A forbidden rule of the space applies: nothing was launched."""
    # Not about the configuration: FAIL trials, the configuration is retried (or not run).
    host_unreachable = "host_unreachable"
    """SSH to the service's host failed or timed out."""
    interrupted = "interrupted"
    """The tuner stopped (Ctrl-C, SIGTERM, killed) during the trial."""
    worker_lost = "worker_lost"
    """The trial's worker stopped beating past its lease; another worker failed it."""
    claimed = "claimed"
    """The configuration was in flight in another worker's trial (not retried)."""

    def __str__(self) -> str:
        return self.value


NOT_THE_CONFIG = frozenset({Failure.host_unreachable})
"""Launch failures that say nothing about the configuration: the trial is not scored."""

NOT_SCORED = frozenset(
    {Failure.host_unreachable, Failure.interrupted, Failure.worker_lost, Failure.claimed}
)
"""Failures stored on FAIL trials: no value, the sampler learns nothing from them."""

OF_THE_CONFIG = frozenset(
    {
        Failure.cuda_oom,
        Failure.nccl_error,
        Failure.cuda_error,
        Failure.config_rejected,
        Failure.readiness_timeout,
        Failure.exited,
        Failure.crashed,
        Failure.trial_timeout,
        Failure.compile_timeout,
        Failure.wrong_output,
        Failure.request_errors,
    }
)
"""Launch failures that are a property of the configuration (the same settings would fail
again on the same engine and hardware): what a warm start carries into a new study. Not
``forbidden`` (the new space has its own rules), nor what the host or the harness caused
(``port_in_use``, ``model_path_missing``, ``bench_failed``, ``unknown``, the FAIL classes)."""

FailureClass = Failure
"""The classes a log can show (the launcher's name for :class:`Failure`)."""


class Classification(NamedTuple):
    """The class of a failure, the log line that shows it ("" when nothing matched) and the
    start-up stage the engine was in when it was written ("" when no stage line of an engine
    came before it: :class:`~autotune.engines.StartStage`)."""

    failure: Failure
    line: str
    stage: str = ""

    @property
    def reason(self) -> str:
        """The line, then the start-up stage it came in (when a stage line preceded it)."""
        if self.stage and self.line:
            return f"{self.line} (while {self.stage})"
        return self.line


# (priority, class, pattern): generic ones (PyTorch, NCCL, CUDA, Hugging Face, argparse,
# uvicorn) here, each engine's own in its module (autotune/engines/), all in one table. The
# highest priority match anywhere in the text wins: an OOM
# reported through NCCL ("Cuda failure 'out of memory'") is an OOM, not an NCCL problem; a
# generic "ValueError:" only counts when nothing more specific is there.
_PATTERNS: tuple[tuple[int, Failure, re.Pattern[str]], ...] = tuple(
    (prio, cls, re.compile(rx, re.IGNORECASE))
    for prio, cls, rx in (
        (100, Failure.cuda_oom, r"OutOfMemoryError: CUDA out of memory"),
        (95, Failure.cuda_oom, r"CUDA out of memory"),
        (95, Failure.cuda_oom, r"CUDA error: out of memory"),
        (95, Failure.cuda_oom, r"Cuda failure '?out of memory"),
        (85, Failure.nccl_error, r"Watchdog caught collective operation timeout"),
        (85, Failure.nccl_error, r"NCCL WARN .*time(d)?[ -]?out"),
        (80, Failure.nccl_error, r"NCCL error"),
        (80, Failure.nccl_error, r"nccl(UnhandledCuda|System|Internal|InvalidUsage)Error"),
        (80, Failure.nccl_error, r"ncclRemoteError"),
        (75, Failure.port_in_use, r"Address already in use"),
        (75, Failure.port_in_use, r"\[Errno 98\]"),
        (70, Failure.model_path_missing, r"does not appear to have a file named config\.json"),
        (70, Failure.model_path_missing, r"OSError: .*Repo id must be"),
        (70, Failure.model_path_missing, r"HFValidationError: .*Repo id must be"),
        (70, Failure.model_path_missing, r"No such file or directory: '/models/"),
        (70, Failure.model_path_missing, r"Can't load the configuration of '"),
        (70, Failure.model_path_missing, r"Incorrect path_or_model_id"),
        (60, Failure.config_rejected, r"error: unrecognized arguments"),
        (60, Failure.config_rejected, r"error: argument --?[\w-]+"),
        (60, Failure.config_rejected, r"ValueError: .*(is )?not supported"),
        (55, Failure.cuda_error, r"CUDA driver version is insufficient"),
        (55, Failure.cuda_error, r"RuntimeError: CUDA error:"),
        (55, Failure.cuda_error, r"No CUDA GPUs are available"),
        (55, Failure.cuda_error, r"CUDA error: (an illegal memory access|device-side assert)"),
        (10, Failure.config_rejected, r"^\s*(\w+\.)*ValueError: "),
    )
) + tuple(
    (p.priority, Failure(p.failure), re.compile(p.pattern, re.IGNORECASE))
    for p in all_failure_patterns()
)

#: The engines' start-up stage lines: the last one before a failure line says where it came.
_STAGES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(s.pattern), s.label) for s in all_start_stages()
)


def stage_of(line: str) -> str | None:
    """The start-up stage a log line says the engine entered, or None."""
    for rx, label in _STAGES:
        if rx.search(line):
            return label
    return None


#: Classes worth failing on while the process is still alive: after these, SGLang's main
#: process often hangs instead of exiting (its scheduler subprocess died).
FATAL_WHILE_ALIVE: frozenset[Failure] = frozenset(
    {Failure.cuda_oom, Failure.nccl_error, Failure.cuda_error}
)


#: Lines torch.compile writes while it works (``TORCH_LOGS=dynamo`` prints the first two).
_COMPILING = re.compile(
    r"torchdynamo start tracing|calling compiler function|torchinductor compiling|"
    r"torch\._(dynamo|inductor)\b"
)

#: Below this priority a match is too generic to name the cause of a live server's fault.
_SPECIFIC = 50


def classify_line(line: str) -> tuple[int, Failure] | None:
    """Priority and class of the best pattern matching one line, or None."""
    best: tuple[int, Failure] | None = None
    for prio, cls, rx in _PATTERNS:
        if (best is None or prio > best[0]) and rx.search(line):
            best = (prio, cls)
    return best


def classify_log(text: str) -> Classification:
    """Classify a log (the output since the service's last start).

    The most specific match wins; among equally specific ones the first line (the root
    cause usually comes before the errors that follow from it). ``unknown`` with an empty
    line when nothing matched.
    """
    scan = LogScan()
    scan.feed(text)
    return scan.result


class LogScan:
    """A log classified piece by piece, as it is read while a service starts.

    :meth:`feed` the new lines as they arrive; :attr:`result` is what :func:`classify_log`
    would say of everything fed so far (the most specific match, the first among equals,
    with the start-up stage of the last stage line before it), so a failure is classified
    from the whole log since the start, not only from the tail that is left to read when it
    happens.
    """

    def __init__(self) -> None:
        self._best: tuple[int, Failure, str, str] | None = None
        self._stage = ""
        self.entered: list[str] = []
        """The start-up stages entered so far, in order (a stage line repeating the current
        stage, as vLLM's two graph captures do, enters nothing new)."""

    def feed(self, text: str, *, fatal: Collection[Failure] = ()) -> bool:
        """Take ``text`` (complete lines); True when one of them is of a ``fatal`` class."""
        hit_fatal = False
        for raw in text.splitlines():
            stage = stage_of(raw)
            if stage is not None:
                if stage != self._stage:
                    self.entered.append(stage)
                self._stage = stage
                continue
            hit = classify_line(raw)
            if hit is None:
                continue
            if self._best is None or hit[0] > self._best[0]:
                self._best = (hit[0], hit[1], raw.strip(), self._stage)
            hit_fatal = hit_fatal or hit[1] in fatal
        return hit_fatal

    @property
    def result(self) -> Classification:
        if self._best is None:
            return Classification(Failure.unknown, "")
        return Classification(self._best[1], self._best[2], self._best[3])


def explain_fault(text: str, *, stalled: bool) -> Classification | None:
    """Why a server that is still running failed its measurement, or None when its log
    does not say.

    A server can break without exiting: transformers serve keeps answering after its
    continuous-batching worker died of a CUDA OOM (every request then gets an error). Only
    specific causes count here (an OOM, a CUDA or NCCL error, a rejected setting), not a
    generic ValueError. ``stalled`` says the server answered nothing in time; then a log
    showing torch.compile at work means it was still compiling: ``compile_timeout``.
    """
    found = classify_log(text)
    if found.failure is not Failure.unknown:
        best = classify_line(found.line)
        if best is not None and best[0] >= _SPECIFIC:
            return found
    if stalled:
        for raw in text.splitlines():
            if _COMPILING.search(raw):
                return Classification(Failure.compile_timeout, raw.strip())
    return None
