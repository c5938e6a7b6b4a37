"""Every failure class a trial can store (``failure`` of its record), in one place.

A failed trial teaches the sampler only if the reason is kept and means the same thing
everywhere: the launcher classifies start-up failures from the logs
(:mod:`autotune.launch.classify`), the pipeline adds what happens after a healthy start, the
study loop what is not about the configuration at all. Readers (status, report, the crash
signatures of the sampler) compare against these values, never against string literals.
"""

from __future__ import annotations

from enum import Enum


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
