"""Why a service failed to start, read from its log.

A crashed trial teaches the tuner something only if the reason is kept: an OOM says "less
memory", a rejected flag says "forbidden combination", an NCCL hang says "transport". The
patterns below are real messages from PyTorch, NCCL, SGLang, Hugging Face and uvicorn.

This sits below the launcher and the service managers (both raise errors with a
:class:`FailureClass`), above only the engines whose own patterns it merges.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from enum import Enum
from typing import NamedTuple

from autotune.engines import all_failure_patterns


class FailureClass(str, Enum):
    """Failure classes stored with a trial (``trial.user_attrs["failure"]``)."""

    cuda_oom = "cuda_oom"
    nccl_error = "nccl_error"
    port_in_use = "port_in_use"
    model_path_missing = "model_path_missing"
    cuda_error = "cuda_error"
    config_rejected = "config_rejected"
    readiness_timeout = "readiness_timeout"
    exited = "exited"
    host_unreachable = "host_unreachable"
    """SSH to the service's host failed or timed out (not a property of the config)."""
    crashed = "crashed"
    """The service was healthy, then died while it was being measured (no known cause)."""
    trial_timeout = "trial_timeout"
    """The trial's deadline (``trial_timeout_s`` of the study) passed."""
    compile_timeout = "compile_timeout"
    """The server was healthy but still compiling (torch.compile) when the warm-up or the
    trial ran out of time: a lever that costs more start-up than a trial can give it."""
    unknown = "unknown"

    def __str__(self) -> str:
        return self.value


class Classification(NamedTuple):
    """The class of a failure and the log line that shows it ("" when nothing matched)."""

    failure: FailureClass
    line: str


# (priority, class, pattern): generic ones (PyTorch, NCCL, CUDA, Hugging Face, argparse,
# uvicorn) here, each engine's own in its module (autotune/engines/), all in one table. The
# highest priority match anywhere in the text wins: an OOM
# reported through NCCL ("Cuda failure 'out of memory'") is an OOM, not an NCCL problem; a
# generic "ValueError:" only counts when nothing more specific is there.
_PATTERNS: tuple[tuple[int, FailureClass, re.Pattern[str]], ...] = tuple(
    (prio, cls, re.compile(rx, re.IGNORECASE))
    for prio, cls, rx in (
        (100, FailureClass.cuda_oom, r"OutOfMemoryError: CUDA out of memory"),
        (95, FailureClass.cuda_oom, r"CUDA out of memory"),
        (95, FailureClass.cuda_oom, r"CUDA error: out of memory"),
        (95, FailureClass.cuda_oom, r"Cuda failure '?out of memory"),
        (85, FailureClass.nccl_error, r"Watchdog caught collective operation timeout"),
        (85, FailureClass.nccl_error, r"NCCL WARN .*time(d)?[ -]?out"),
        (80, FailureClass.nccl_error, r"NCCL error"),
        (80, FailureClass.nccl_error, r"nccl(UnhandledCuda|System|Internal|InvalidUsage)Error"),
        (80, FailureClass.nccl_error, r"ncclRemoteError"),
        (75, FailureClass.port_in_use, r"Address already in use"),
        (75, FailureClass.port_in_use, r"\[Errno 98\]"),
        (70, FailureClass.model_path_missing, r"does not appear to have a file named config\.json"),
        (70, FailureClass.model_path_missing, r"OSError: .*Repo id must be"),
        (70, FailureClass.model_path_missing, r"HFValidationError: .*Repo id must be"),
        (70, FailureClass.model_path_missing, r"No such file or directory: '/models/"),
        (70, FailureClass.model_path_missing, r"Can't load the configuration of '"),
        (70, FailureClass.model_path_missing, r"Incorrect path_or_model_id"),
        (60, FailureClass.config_rejected, r"error: unrecognized arguments"),
        (60, FailureClass.config_rejected, r"error: argument --?[\w-]+"),
        (60, FailureClass.config_rejected, r"ValueError: .*(is )?not supported"),
        (55, FailureClass.cuda_error, r"CUDA driver version is insufficient"),
        (55, FailureClass.cuda_error, r"RuntimeError: CUDA error:"),
        (55, FailureClass.cuda_error, r"No CUDA GPUs are available"),
        (55, FailureClass.cuda_error, r"CUDA error: (an illegal memory access|device-side assert)"),
        (10, FailureClass.config_rejected, r"^\s*(\w+\.)*ValueError: "),
    )
) + tuple(
    (p.priority, FailureClass(p.failure), re.compile(p.pattern, re.IGNORECASE))
    for p in all_failure_patterns()
)

#: Classes worth failing on while the process is still alive: after these, SGLang's main
#: process often hangs instead of exiting (its scheduler subprocess died).
FATAL_WHILE_ALIVE: frozenset[FailureClass] = frozenset(
    {FailureClass.cuda_oom, FailureClass.nccl_error, FailureClass.cuda_error}
)


#: Lines torch.compile writes while it works (``TORCH_LOGS=dynamo`` prints the first two).
_COMPILING = re.compile(
    r"torchdynamo start tracing|calling compiler function|torchinductor compiling|"
    r"torch\._(dynamo|inductor)\b"
)

#: Below this priority a match is too generic to name the cause of a live server's fault.
_SPECIFIC = 50


def classify_line(line: str) -> tuple[int, FailureClass] | None:
    """Priority and class of the best pattern matching one line, or None."""
    best: tuple[int, FailureClass] | None = None
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
    best: tuple[int, FailureClass, str] | None = None
    for raw in text.splitlines():
        hit = classify_line(raw)
        if hit is not None and (best is None or hit[0] > best[0]):
            best = (hit[0], hit[1], raw.strip())
    if best is None:
        return Classification(FailureClass.unknown, "")
    return Classification(best[1], best[2])


class LogScan:
    """A log classified piece by piece, as it is read while a service starts.

    :meth:`feed` the new lines as they arrive; :attr:`result` is what :func:`classify_log`
    would say of everything fed so far (the most specific match, the first among equals),
    so a failure is classified from the whole log since the start, not only from the tail
    that is left to read when it happens.
    """

    def __init__(self) -> None:
        self._best: tuple[int, FailureClass, str] | None = None

    def feed(self, text: str, *, fatal: Collection[FailureClass] = ()) -> bool:
        """Take ``text`` (complete lines); True when one of them is of a ``fatal`` class."""
        hit_fatal = False
        for raw in text.splitlines():
            hit = classify_line(raw)
            if hit is None:
                continue
            if self._best is None or hit[0] > self._best[0]:
                self._best = (hit[0], hit[1], raw.strip())
            hit_fatal = hit_fatal or hit[1] in fatal
        return hit_fatal

    @property
    def result(self) -> Classification:
        if self._best is None:
            return Classification(FailureClass.unknown, "")
        return Classification(self._best[1], self._best[2])


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
    if found.failure is not FailureClass.unknown:
        best = classify_line(found.line)
        if best is not None and best[0] >= _SPECIFIC:
            return found
    if stalled:
        for raw in text.splitlines():
            if _COMPILING.search(raw):
                return Classification(FailureClass.compile_timeout, raw.strip())
    return None
