"""The tuning loop: ask -> check -> render -> restart -> probe -> load -> score -> tell.

One trial at a time per worker (ask/tell), so each phase can be timed, shown and recovered.
A configuration is never launched when a forbidden rule applies, never launched twice (an
identical earlier result is reused), and a launch that fails is completed as infeasible with
its failure class so the sampler learns to avoid it.

Faults (RELIABILITY.md): each trial has a deadline (``trial_timeout_s``) that caps restart,
probe and load; a service that dies while measured makes the trial infeasible (``crashed``
or the class its log shows) and every service is restarted for the next trial. A measured
outcome is written to a local journal before storage, and storage writes are never cut by
Ctrl-C/SIGTERM (deferred to just after the write): killed or failed at any point, the study
holds either a COMPLETE trial or a RUNNING one that the next run completes from the journal
(measured) or fails as ``interrupted`` and retries (not measured).

Cheaper trials: the load generator can stop measuring once its throughput estimate is tight
(``load.target_rel_ci``) and the loop can abort a trial whose running estimate is clearly
below the incumbent (``early_abort``); such a trial keeps its partial estimate, is marked
``aborted`` and never wins unless re-measured. Before a winner is declared (the trial target
reached), the top-k configurations are measured again from fresh processes
(``remeasure``); those measurements are study attributes, not trials, so trial counts, the
reuse index and the sampler never see them, and they are journaled and resumed like trials.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import signal
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.deployment import Deployment, load_deployment
from autotune.engines import get_engine
from autotune.errors import (
    AutotuneError,
    BenchError,
    BenchTimeout,
    ConfigError,
    LaunchError,
    StorageError,
)
from autotune.failpoints import failpoint
from autotune.launch import Launcher, explain_fault
from autotune.launch.factory import make_launcher
from autotune.loadgen import (
    SLO,
    AbortRule,
    LiveEstimate,
    LoadSpec,
    probe_text,
    rescale_time,
    run_load,
)
from autotune.render import render
from autotune.results import (
    best_estimate,
    feasible,
    format_estimate,
    load_remeasurements,
    remeasure_candidates,
    remeasure_key,
)
from autotune.secrets import redact
from autotune.space import SearchSpace, load_space
from autotune.specs import ServiceSpec
from autotune.study.claims import claim, claim_key, take_over
from autotune.study.definition import EarlyAbortSettings, StudyDefinition
from autotune.study.effective import find_overrides
from autotune.study.journal import Journal
from autotune.study.objectives import Objective
from autotune.study.progress import NullProgress, ProgressSink, TrialReport
from autotune.study.record import (
    TrialOutcome,
    fail_trial,
    failed_outcome,
    finish_trial,
    reused_outcome,
)
from autotune.study.samplers import make_sampler
from autotune.study.storage import (
    batched_writes,
    batching,
    check_study_name,
    create_or_load_study,
    describe_storage_failure,
    display_url,
    is_server_url,
    open_storage,
    retrying,
    storage_errors,
)
from autotune.study.workers import (
    TRIAL_WORKER_ATTR,
    LostTrial,
    Worker,
    WorkerBusy,
    default_worker_name,
    fail_lost_trial,
    is_gone,
    lost_trials,
    read_workers,
)

REFERENCE_ATTR = "reference_output"
NOT_THE_CONFIG = frozenset({"host_unreachable"})
"""Launch failures that say nothing about the configuration: the trial is not scored."""
BASELINE_CLAIM = "autotune:claim:baseline"
"""Held by whichever worker enqueued the baseline of a new study."""
FAULT_SCAN_LINES = 2000
"""Log lines searched for the cause of a live server's fault: the traceback of an OOM in a
worker thread can sit under hundreds of access-log lines of the requests that failed after it."""
MEASURED_PHASES = ("restart", "probe", "warmup", "measure")
"""Time spent on the deployment; the rest of a trial is the tuner's own (``tuner``)."""
COUNT_REFRESH = 10
"""Trials between two reads of the completed count from storage (other workers add some)."""
REMEASURE_ID_BASE = 1000
"""Journal key of re-measurement R of trial N: N * 1000 + R (repeats are at most 20)."""


_T = TypeVar("_T")
_INTERRUPT_PENDING = threading.Event()
"""Ctrl-C/SIGTERM arrived inside a deferred block (see :func:`_deferred_interrupts`)."""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _dir_name(worker: str) -> str:
    """A worker name as one directory name (names may hold '/' and ':')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", worker)


class ClaimedElsewhere(Exception):
    """The proposed configuration is being measured by another trial (another worker)."""

    def __init__(self, owner: int, worker: str | None) -> None:
        by = f" (worker {worker})" if worker else ""
        super().__init__(f"the same configuration is being measured by trial #{owner}{by}")
        self.owner = owner


class HostFailure(AutotuneError):
    """A host could not be reached: the run stops; the trial's config is retried on resume."""


@dataclass
class RunSummary:
    """What ``autotune run`` did in this invocation."""

    study_name: str
    storage_url: str
    trials_run: int
    trials_total: int
    interrupted: bool
    seconds: float
    stopped: list[str] = field(default_factory=list)
    """Services this run stopped on its way out."""
    left_running: list[str] = field(default_factory=list)
    """Services still running after it (a second Ctrl-C cut the clean-up short)."""
    remeasured: int = 0
    """Re-measurements stored by this run."""
    in_remeasure: bool = False
    """The interruption came while re-measuring (nothing was cut short into a FAIL trial)."""


def _on_wall_clock(limit_ms: float | None, speedup: float) -> float | None:
    return None if limit_ms is None else limit_ms / speedup


@contextmanager
def _handling(sigs: tuple[signal.Signals, ...], handler: Any) -> Iterator[None]:
    """``handler`` for ``sigs`` during the block (signals exist in the main thread only)."""
    try:
        previous = {sig: signal.signal(sig, handler) for sig in sigs}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _sigterm_as_interrupt() -> AbstractContextManager[None]:
    """SIGTERM takes the same clean path as Ctrl-C."""
    return _handling((signal.SIGTERM,), _raise_interrupt)


@contextmanager
def _deferred_interrupts() -> Iterator[None]:
    """Ctrl-C/SIGTERM inside the block take effect right after it.

    Wraps storage writes, so an interrupt never leaves a trial half-written; each write is
    short, so the user still sees the run stop within a second.
    """
    received: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        received.append(signum)
        _INTERRUPT_PENDING.set()  # a database retry inside the block stops waiting

    with _handling((signal.SIGINT, signal.SIGTERM), hold):
        yield
    if received:
        _INTERRUPT_PENDING.clear()
        raise KeyboardInterrupt


def early_abort_reason(
    estimate: LiveEstimate,
    *,
    settings: EarlyAbortSettings,
    incumbent: tuple[float, int],
    streams: int,
    output_len: int,
    speedup: float = 1.0,
) -> str | None:
    """Why the measure phase should stop now, or None: even an optimistic figure for this
    trial is below ``abort_below`` x the incumbent's throughput (``incumbent``: throughput,
    trial number; in modeled time, so the wall-clock estimate is divided by ``speedup``).

    The optimistic figure is, in order of what is known:

    * the upper 95% confidence bound, once the load generator has an interval;
    * every stream finished a request: the running estimate x (1 + ``margin_before_ci``);
      the steady rate may cover only the start of the second round (all streams back in
      prefill: low) and completed tokens / elapsed sinks between completions, so the larger
      of the two is taken;
    * the first round unfinished but ``k >= 1`` of its requests done (a server that serves
      one request at a time): the ``streams - k`` requests still out have lasted
      ``elapsed_s``, so the round's mean latency is at least ``(streams - k) / streams x
      elapsed_s``, and by Little's law a closed loop of ``streams`` cannot give more than
      ``streams x output_len`` tokens per mean latency; that bound x (1 +
      ``margin_before_ci``). A one-at-a-time server is therefore cut after a few requests
      instead of after a whole round of them (minutes on a GPU; BENCHMARKS.md, H200
      section). Never with nothing done: the trial's figure is its completed requests, and
      a trial without any would be stored as a failure, not as a slow configuration.
    """
    margin = settings.margin_before_ci
    half = estimate.rel_half_width
    rate = estimate.output_throughput
    shown = rate / speedup
    done = estimate.completed
    elapsed = estimate.elapsed_s
    if half is not None and math.isfinite(half):
        basis = "upper 95% bound"
    elif margin is None:
        return None
    elif done >= streams:
        if elapsed > 0:
            rate = max(rate, done * output_len / elapsed)
        shown = rate / speedup
        half, basis = margin, f"estimate + {margin:.0%} (no interval yet)"
    elif elapsed > 0 and done >= 1:
        rate = max(rate, streams * streams * output_len / ((streams - done) * elapsed))
        half = margin
        basis = f"first round unfinished after {elapsed:.1f} s: latency bound + {margin:.0%}"
    else:
        return None
    upper = rate / speedup * (1.0 + half)
    if upper >= settings.abort_below * incumbent[0]:
        return None
    return (
        f"{shown:,.1f} tok/s after {done} requests, {basis} {upper:,.1f} < "
        f"{settings.abort_below:g} x incumbent #{incumbent[1]} ({incumbent[0]:,.1f} tok/s)"
    )


class Tuner:
    """Runs a study defined by a :class:`StudyDefinition` against one deployment."""

    def __init__(
        self,
        *,
        definition: StudyDefinition,
        study_name: str,
        storage_url: str,
        sampler: str | None = None,
        seed: int | None = None,
        launcher: Launcher | None = None,
        progress: ProgressSink | None = None,
        run_dir: Path | None = None,
        worker: str | None = None,
        deployment: Path | None = None,
    ) -> None:
        self.definition = definition
        self.study_name = check_study_name(study_name)
        self.storage_url = storage_url
        self.space: SearchSpace = load_space(definition.resolve(definition.space))
        self.engine = get_engine(self.space.model.engine.name, self.space.model.engine.version)
        self.engines = {  # what each service the space sets levers on runs
            service: get_engine(
                self.space.engine_ref(service).name, self.space.engine_ref(service).version
            )
            for service in self.space.services
        }
        self._version_warnings: set[str] = set()
        self.deployment: Deployment = load_deployment(
            deployment if deployment is not None else definition.resolve(definition.deployment)
        )
        self.objective = Objective(kind=definition.objective, slo=definition.slo)
        self.progress = progress or NullProgress()
        sampler_name = sampler or definition.sampler
        self.sampler = make_sampler(
            sampler_name,
            seed=seed if seed is not None else definition.seed,
            grid=self.space.grid() if sampler_name == "grid" else None,
            multi_objective=len(self.objective.directions) > 1,
        )
        self.storage = open_storage(storage_url, create=True)
        self.study = create_or_load_study(
            study_name,
            batching(
                self.storage,
                retry=lambda what, fn: retrying(
                    fn,
                    url=storage_url,
                    what=what,
                    on_wait=self.progress.message,
                    stop=_INTERRUPT_PENDING.is_set,
                ),
            ),
            directions=self.objective.directions,
            sampler=self.sampler,
            metric_names=self.objective.metric_names,
        )
        self.worker_name = worker or default_worker_name(self.deployment.name)
        # Named workers keep their own journal and service state (several may share a host).
        default_dir = self.deployment.default_run_dir(study_name)
        self.run_dir = run_dir or (
            default_dir / "workers" / _dir_name(worker) if worker else default_dir
        )
        self.launcher = launcher or make_launcher(self.deployment, run_dir=self.run_dir)
        self.journal = Journal(
            self.run_dir / "journal", storage_url=storage_url, study_name=study_name
        )
        self.remeasure_journal = Journal(
            self.run_dir / "journal", storage_url=storage_url, study_name=f"{study_name}#remeasure"
        )
        self._known: dict[str, int] = {}
        self._incumbent: tuple[float, int] | None = None
        """(throughput, trial) of the best feasible, fully measured trial: kept in memory."""
        self._remeasuring = False
        self._remeasured = 0
        self.worker = Worker(
            self.study,
            name=self.worker_name,
            deployment=self.deployment.name,
            heartbeat_s=definition.workers.heartbeat_s,
            lease_s=definition.workers.lease_s,
            on_error=self.progress.message,
        )
        self.shared = is_server_url(storage_url)
        """Several workers may share the study (a database server): configurations are
        claimed, lost trials looked for and counts read back every trial. On SQLite one
        worker runs at a time (a second one is refused) and none of that costs a write."""

    # ------------------------------------------------------------------ set-up

    def _load_spec(self) -> LoadSpec:
        load = self.definition.load
        slo = self.definition.slo
        speedup = self.deployment.sim_speedup
        return LoadSpec(
            target_rel_ci=load.target_rel_ci,
            min_duration_s=load.min_duration_s,
            concurrency=load.concurrency,
            input_len=load.input_len,
            output_len=load.output_len,
            warmup_requests=load.warmup_requests
            if load.warmup_requests is not None
            else load.concurrency,
            requests=load.requests,
            duration_s=load.duration_s,
            max_duration_s=load.max_duration_s,
            request_timeout_s=load.request_timeout_s,
            api=load.api,
            # what the study file leaves unsaid, the engine's request quirks decide
            prompt=load.prompt if "prompt" in load.model_fields_set else self.engine.quirks.prompt,
            ignore_eos=load.ignore_eos
            if "ignore_eos" in load.model_fields_set
            else self.engine.quirks.ignore_eos,
            require_done=load.require_done
            if "require_done" in load.model_fields_set
            else self.engine.quirks.require_done,
            model=self.deployment.model,
            slo=SLO(
                ttft_ms=_on_wall_clock(slo.ttft_p99_ms, speedup),
                tpot_ms=_on_wall_clock(slo.tpot_p99_ms, speedup),
                e2e_ms=_on_wall_clock(slo.e2e_p99_ms, speedup),
            ),
        )

    def _check_engine_version(
        self, effective: Mapping[str, Mapping[str, Any]], attrs: dict[str, Any]
    ) -> None:
        """Store the engine version each server reports; warn once when it is not the one
        the space names (its options were checked against another release)."""
        versions: dict[str, str] = {}
        for service, info in effective.items():
            engine = self.engines.get(self.deployment.role_of(service))
            if engine is None or not info:
                continue
            version = engine.version_from(info)
            if version is not None:
                versions[service] = version
            warning = engine.version_mismatch(service, info)
            if warning is not None and warning not in self._version_warnings:
                self._version_warnings.add(warning)
                self.progress.message(f"warning: {warning}")
        if versions:
            attrs["engine_version"] = versions

    def _recover_stale(self) -> None:
        """Trials left RUNNING by a tuner that died or could not write are settled.

        Measured ones (their outcome is in the journal) are recorded as they were measured;
        the others are failed as ``interrupted`` and their config retried.
        """
        self._recover_remeasurements()
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        running_ids = {t._trial_id for t in running}
        for trial_id in self.journal.trial_ids():
            if trial_id not in running_ids:  # recorded already; the tuner died before cleaning
                self.journal.discard(trial_id)
        now = _utcnow()
        records = read_workers(self.study)
        live = {
            name
            for name, record in records.items()
            if name != self.worker_name
            and record is not None
            and record.is_live(now)
            and not is_gone(record)
        }
        for trial in running:
            owner = trial.system_attrs.get(TRIAL_WORKER_ATTR)
            if owner in live or (owner is None and live):
                continue  # another worker's, alive (or unknown: its lease decides)
            if owner is not None and owner != self.worker_name:
                record = records.get(owner)
                gone = "its record is unreadable" if record is None else record.describe_gone(now)
                self._fail_lost(
                    LostTrial(trial._trial_id, trial.number, owner, None),
                    reason=f"worker {owner!r} is gone ({gone}); the config is retried",
                )
                continue
            saved = self.journal.load(trial._trial_id)
            if saved is not None:
                with _deferred_interrupts():
                    finish_trial(
                        self.study,
                        optuna.Trial(self.study, trial._trial_id),
                        saved,
                        constraint_keys=self.objective.constraint_keys,
                    )
                self.journal.discard(trial._trial_id)
                self.progress.message(
                    f"trial #{trial.number} was measured but not stored (the tuner stopped "
                    "or the storage failed while writing it); recorded now from the journal"
                )
                continue
            self.storage.set_trial_user_attr(trial._trial_id, "failure", "interrupted")
            self.storage.set_trial_user_attr(
                trial._trial_id,
                "reason",
                "the tuner stopped during this trial; its config is retried",
            )
            self.storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
            self._retry_later(trial)
            self.progress.message(
                f"trial #{trial.number} was interrupted earlier; retrying its config"
            )

    def _recover_remeasurements(self) -> None:
        """Re-measurements journaled but not stored (the tuner stopped between the two) are
        stored now; entries already stored are discarded."""
        ids = self.remeasure_journal.trial_ids()
        if not ids:
            return
        stored = self.study.user_attrs
        for entry in ids:
            saved = self.remeasure_journal.load(entry)
            if saved is not None:
                key = remeasure_key(int(saved.attrs["of"]), int(saved.attrs["repeat"]))
                if key not in stored:
                    with _deferred_interrupts():
                        self.study.set_user_attr(key, saved.attrs)
                    self.progress.message(
                        f"re-measurement {saved.attrs['repeat']} of trial #{saved.attrs['of']} "
                        "was measured but not stored; recorded now from the journal"
                    )
            self.remeasure_journal.discard(entry)

    def _reap_lost(self) -> None:
        """Fail and re-queue the trials of workers that stopped beating (other workers')."""
        lease = self.definition.workers.lease_s
        for lost in lost_trials(self.study, lease_s=lease, exclude_worker=self.worker_name):
            who = f"worker {lost.worker!r}" if lost.worker else "its worker"
            silent = (
                f"no heartbeat for {lost.silent_s:.0f} s"
                if lost.silent_s is not None
                else "no heartbeat at all"
            )
            self._fail_lost(
                lost, reason=f"{who} stopped ({silent}, lease {lease:g} s); the config is retried"
            )

    def _fail_lost(self, lost: LostTrial, *, reason: str) -> None:
        with _deferred_interrupts():
            if not fail_lost_trial(self.study, lost, reason=reason):
                return  # another worker did it first
            self._retry_later(self.study.trials[lost.number])
        self.progress.message(f"trial #{lost.number} failed as worker_lost: {reason}")

    def _phase(self, name: str) -> None:
        self.progress.phase(name)
        self.worker.on_phase(name)

    @staticmethod
    def _baseline_attr(trial: FrozenTrial) -> dict[str, Any]:
        return {"is_baseline": True} if trial.user_attrs.get("is_baseline") else {}

    def _enqueue_baseline(self) -> None:
        """The baseline is trial 0 of a new study: enqueued by the first worker only."""
        if self.study.get_trials(deepcopy=False):
            return
        if claim(self.study, BASELINE_CLAIM, -1).won:
            self.study.enqueue_trial(self.space.baseline_params(), user_attrs={"is_baseline": True})

    def _index_known(self) -> None:
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            config = trial.user_attrs.get("config")
            if config is not None and trial.user_attrs.get("failure") != "interrupted":
                self._known.setdefault(self.space.config_key(config), trial.number)
            if (
                feasible(trial)
                and trial.user_attrs.get("failure") is None
                and not trial.user_attrs.get("aborted")
            ):
                self._consider_incumbent(trial.values[0], trial.number)

    def _consider_incumbent(self, throughput: float, number: int) -> None:
        if self._incumbent is None or (throughput, -number) > (
            self._incumbent[0],
            -self._incumbent[1],
        ):
            self._incumbent = (throughput, number)

    def completed_count(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def _db(self, what: str, fn: Callable[[], _T]) -> _T:
        """``fn`` (direct SQL: claims, lost trials) retried with backoff while a database
        server is unreachable; storage calls through Optuna are retried by the storage."""
        return retrying(
            fn,
            url=self.storage_url,
            what=what,
            on_wait=self.progress.message,
            stop=_INTERRUPT_PENDING.is_set,
        )

    # ------------------------------------------------------------------ loop

    def run(self, *, n_trials: int) -> RunSummary:
        """Run until the study holds ``n_trials`` completed trials (resumes where it stopped)."""
        started = time.monotonic()
        ran = 0
        self._remeasured = 0
        self._remeasuring = False
        interrupted = False
        failed = True
        try:
            with _sigterm_as_interrupt(), storage_errors(self.storage_url, "accessing the study"):
                try:
                    self.worker.start(alone=not self.shared)
                except WorkerBusy as exc:
                    raise ConfigError(str(exc), field="--worker") from None
                self._recover_stale()
                self._enqueue_baseline()
                self._index_known()
                done = self.completed_count()
                while done < n_trials:
                    if self.shared:
                        self._db("looking for lost trials", self._reap_lost)
                    if self._one_trial(index=done + 1, total=n_trials):
                        ran += 1
                        done += 1
                    # Counted in memory (a read of every new trial costs ~6 ms) when this is
                    # the only worker; shared storage is asked every trial.
                    if self.shared or ran % COUNT_REFRESH == 0 or done >= n_trials:
                        done = self.completed_count()
                self._remeasure_phase()
            failed = False
        except KeyboardInterrupt:
            interrupted = True
            failed = False
        finally:
            self.worker.stop("interrupted" if interrupted else "failed" if failed else "stopped")
            stopped, left = self._wind_down(stop=failed or interrupted)
        with storage_errors(self.storage_url, "accessing the study"):
            total = self.completed_count()
        return RunSummary(
            study_name=self.study_name,
            storage_url=self.storage_url,
            trials_run=ran,
            trials_total=total,
            interrupted=interrupted,
            seconds=time.monotonic() - started,
            stopped=stopped,
            left_running=left,
            remeasured=self._remeasured,
            in_remeasure=interrupted and self._remeasuring,
        )

    def _wind_down(self, *, stop: bool) -> tuple[list[str], list[str]]:
        """Stop the services (unless kept on purpose); (stopped, still running).

        A second Ctrl-C during the stop leaves the rest running, recorded where ``autotune
        restore`` and the next ``autotune run`` find and stop them.
        """
        running = self.launcher.running()
        if self.definition.keep_services_running and not stop:
            self.launcher.detach()
            return [], running
        try:
            failpoint("winddown")
            self.launcher.stop_all()
            self.launcher.close()
        except KeyboardInterrupt:
            left = self.launcher.running()
            self.launcher.detach()
            return [n for n in running if n not in left], left
        return running, []

    def _one_trial(self, *, index: int, total: int) -> bool:
        """One trial, stored; False when it was not run (its config was claimed by another
        worker's trial in flight: recorded as FAIL, not counted)."""
        t0 = time.monotonic()
        trial: optuna.Trial | None = None
        try:
            with _deferred_interrupts():
                trial = self.study.ask()
            self.worker.on_trial(trial)
            failpoint("trial.asked")
            with _deferred_interrupts(), batched_writes(self.study, trial._trial_id):
                # One transaction for all the parameters (each would be its own commit) and
                # the owner, written before anything is launched, so a retry finds them.
                self.study._storage.set_trial_system_attr(
                    trial._trial_id, TRIAL_WORKER_ATTR, self.worker_name
                )
                config = self.space.suggest(trial)
            self.progress.trial_started(
                number=trial.number, index=index, total=total, config=config
            )
            outcome = self._evaluate(
                config,
                is_baseline=bool(trial.user_attrs.get("is_baseline", False)),
                claim_as=trial.number if self.shared else None,
            )
        except ClaimedElsewhere as exc:
            assert trial is not None
            with _deferred_interrupts():
                fail_trial(self.study, trial, failure="claimed", reason=str(exc))
            self.worker.on_trial(None)
            self.progress.message(f"trial #{trial.number} not run: {exc}")
            return False
        except HostFailure as exc:
            assert trial is not None  # raised by _evaluate
            fail_trial(self.study, trial, failure="host_unreachable", reason=str(exc))
            self._retry_later(trial)
            raise
        except KeyboardInterrupt:
            if trial is None:  # interrupted before the trial existed
                raise
            with _deferred_interrupts():
                fail_trial(
                    self.study,
                    trial,
                    failure="interrupted",
                    reason="stopped by the user (Ctrl-C/SIGTERM)",
                )
                self._retry_later(trial)
            self.progress.message(
                f"interrupted during trial #{trial.number}: recorded as FAIL (interrupted), "
                "its config will be retried by the next `autotune run`; services are being stopped"
            )
            raise
        elapsed = self._close_phases(outcome, t0)
        self._phase("store")
        stored = self._store(trial, outcome)
        self.worker.on_trial(None)
        if not stored:
            return False
        self.worker.trial_done()
        key = self.space.config_key(config)
        if outcome.attrs.get("reused_from") is None:
            self._known.setdefault(key, trial.number)
        if outcome.failure is None and outcome.feasible and not outcome.attrs.get("aborted"):
            self._consider_incumbent(outcome.values[0], trial.number)
        self._report(trial.number, outcome, elapsed)
        return True

    @staticmethod
    def _close_phases(outcome: TrialOutcome, t0: float) -> float:
        """Set ``tuner`` (what is not time on the deployment) and ``total``; the elapsed s."""
        elapsed = time.monotonic() - t0
        phases = outcome.attrs.setdefault("phase_seconds", {})
        measured = sum(phases.get(k, 0.0) for k in MEASURED_PHASES)
        phases["tuner"] = max(0.0, elapsed - measured)
        phases["total"] = elapsed
        return elapsed

    def _report(self, number: int, outcome: TrialOutcome, elapsed: float) -> None:
        best = self._incumbent
        reason = outcome.attrs.get("reason")
        if outcome.attrs.get("aborted"):
            reason = f"aborted: {outcome.attrs['aborted']}"
        self.progress.trial_finished(
            TrialReport(
                number=number,
                throughput=outcome.values[0] if outcome.failure is None else None,
                failure=outcome.failure,
                reason=reason,
                best=best[0] if best else None,
                best_number=best[1] if best else None,
                seconds=elapsed,
                reused_from=outcome.attrs.get("reused_from"),
                aborted=bool(outcome.attrs.get("aborted")),
            )
        )

    def _store(self, trial: optuna.Trial, outcome: TrialOutcome) -> bool:
        """Journal first, then storage, with Ctrl-C/SIGTERM held until both are done.

        A failed write keeps the measurement in the journal for the next run (a database
        server that went away is waited for first, see ``autotune.study.storage.retrying``;
        Ctrl-C ends that wait). False: another worker had already failed the trial as lost
        (this one was silent past the lease) and re-queued its configuration; the
        measurement is dropped so the configuration is not recorded twice.
        """
        outcome.attrs = redact(outcome.attrs)  # the journal holds no secret either
        with _deferred_interrupts():
            journaled = self._journal(trial, outcome)
            failpoint("journal.saved")
            try:
                finish_trial(
                    self.study, trial, outcome, constraint_keys=self.objective.constraint_keys
                )
            except optuna.exceptions.UpdateFinishedTrialError:
                if journaled is not None:
                    self.journal.discard(trial._trial_id)
                self.progress.message(
                    f"trial #{trial.number} was taken over by another worker while this one "
                    "sent no heartbeat for longer than the lease; its configuration was "
                    "re-queued there, so this measurement is not stored"
                )
                return False
            except Exception as exc:
                kept = (
                    f"its measurement is kept in {journaled} and the next `autotune run` "
                    "records it before anything else"
                    if journaled
                    else "it stays RUNNING; the next `autotune run` fails it as interrupted "
                    "and retries its config"
                )
                why = describe_storage_failure(exc, url=self.storage_url)
                raise StorageError(
                    f"could not record trial #{trial.number} in {display_url(self.storage_url)}: "
                    f"{why}. Nothing was half-written: {kept}"
                ) from exc
            failpoint("trial.told")
            if journaled is not None:
                self.journal.discard(trial._trial_id)
        return True

    def _journal(self, trial: optuna.Trial, outcome: TrialOutcome) -> Path | None:
        """Save a measured outcome locally; None when nothing was measured or it failed."""
        if not outcome.attrs.get("phase_seconds", {}).get("restart", 0.0):
            return None  # forbidden or reused: free to recompute
        try:
            return self.journal.save(trial._trial_id, number=trial.number, outcome=outcome)
        except OSError as exc:
            self.progress.message(
                f"could not journal trial #{trial.number} ({exc.strerror or exc}); "
                "writing it to storage directly"
            )
            return None

    def _retry_later(self, trial: optuna.Trial | FrozenTrial) -> None:
        """Enqueue the parameters of a trial that was not scored (interrupted, host down).

        A trial stopped before it suggested anything still carries the parameters it was
        enqueued with (the baseline, a retry): those are what is retried.
        """
        frozen = self.study.trials[trial.number]
        params = frozen.params or frozen.system_attrs.get("fixed_params") or {}
        if params:
            attrs = {"retry_of": trial.number, **self._baseline_attr(frozen)}
            self.study.enqueue_trial(params, user_attrs=attrs)

    # ------------------------------------------------------------------ re-measure

    def _remeasure_plan(self) -> list[tuple[int, int, dict[str, Any]]]:
        """(trial, repeat, config) still to measure: round by round over the top-k."""
        settings = self.definition.remeasure
        if settings.top_k <= 0 or settings.repeats <= 0:
            return []
        done = {(m.of, m.repeat) for m in load_remeasurements(self.study)}
        top = remeasure_candidates(self.study, settings.top_k)
        return [
            (e.trial.number, repeat, self.space.complete(e.trial.config))
            for repeat in range(1, settings.repeats + 1)
            for e in top
            if (e.trial.number, repeat) not in done and e.trial.config
        ]

    def _remeasure_phase(self) -> None:
        """Measure the top-k configurations again, each from fresh processes.

        Resumable: what is stored is not measured again, so an interrupted phase continues
        where it stopped (a re-measurement cut short stores nothing). The plan is drawn
        again after each run: a configuration whose re-measurement failed leaves the top-k
        and the next one takes its place.
        """
        plan = self._remeasure_plan()
        if not plan:
            return
        self._remeasuring = True
        numbers = ", ".join(f"#{n}" for n in dict.fromkeys(n for n, _, _ in plan))
        self.progress.message(
            f"re-measuring the best configurations before declaring a winner: {len(plan)} "
            f"run(s) of {numbers}, each from freshly started services"
        )
        settings = self.definition.remeasure
        limit = 3 * settings.top_k * settings.repeats
        index = 0
        skipped: set[tuple[int, int]] = set()
        while plan and index < limit:
            index += 1
            number, repeat, config = plan[0]
            # Several workers reach the end together: each re-measurement is claimed, and
            # one another worker holds is left to it.
            key = f"autotune:claim:remeasure:{number}:{repeat}"
            # The worker's own number (no trial has it), the same after a restart: a claim
            # left by its interrupted predecessor is its own again.
            owner = (1 << 40) + zlib.crc32(self.worker_name.encode("utf-8"))
            if (
                not self.shared
                or self._db(
                    "claiming a re-measurement",
                    functools.partial(claim, self.study, key, owner),
                ).won
            ):
                self._remeasure_one(
                    number, repeat, config, index=index, total=index - 1 + len(plan)
                )
            else:
                skipped.add((number, repeat))
            plan = [p for p in self._remeasure_plan() if (p[0], p[1]) not in skipped]
        self._remeasuring = False
        best = best_estimate(self.study)
        if best is not None:
            self.progress.message(
                f"winner: trial #{best.trial.number}, {format_estimate(best)}; "
                f"conservative estimate {best.lower:,.1f} tok/s"
            )

    def _remeasure_one(
        self, number: int, repeat: int, config: dict[str, Any], *, index: int, total: int
    ) -> None:
        t0 = time.monotonic()
        self.progress.trial_started(
            number=number, index=index, total=total, config=config, kind="re-measure"
        )
        outcome = self._evaluate(config, is_baseline=False, fresh=True)
        elapsed = self._close_phases(outcome, t0)
        attrs = outcome.attrs
        record: dict[str, Any] = {
            "of": number,
            "repeat": repeat,
            "values": outcome.values,
            "constraints": outcome.constraints,
            "feasible": outcome.feasible and outcome.failure is None,
            **{
                k: attrs.get(k)
                for k in (
                    "metrics",
                    "phase_seconds",
                    "failure",
                    "reason",
                    "stop_reason",
                    "sim_speedup",
                    "restarted",
                )
                if k in attrs
            },
        }
        stored = TrialOutcome(
            values=outcome.values, constraints=outcome.constraints, attrs=redact(record)
        )
        entry = number * REMEASURE_ID_BASE + repeat
        with _deferred_interrupts():
            try:
                journaled: Path | None = self.remeasure_journal.save(
                    entry, number=number, outcome=stored
                )
            except OSError:
                journaled = None
            failpoint("journal.saved")
            try:
                self.study.set_user_attr(remeasure_key(number, repeat), stored.attrs)
            except Exception as exc:
                kept = (
                    f"it is kept in {journaled} and the next `autotune run` records it"
                    if journaled
                    else "the next `autotune run` measures it again"
                )
                why = describe_storage_failure(exc, url=self.storage_url)
                raise StorageError(
                    f"could not record re-measurement {repeat} of trial #{number} in "
                    f"{display_url(self.storage_url)}: {why}. {kept}"
                ) from exc
            failpoint("trial.told")
            if journaled is not None:
                self.remeasure_journal.discard(entry)
        self._remeasured += 1
        self._report(number, outcome, elapsed)

    # ------------------------------------------------------------------ one trial

    def _evaluate(
        self,
        config: dict[str, Any],
        *,
        is_baseline: bool,
        fresh: bool = False,
        claim_as: int | None = None,
    ) -> TrialOutcome:
        """Launch, probe and load ``config``; ``fresh``: a re-measurement (every service
        started anew, never reused, never aborted); ``claim_as``: the trial that claims the
        configuration in the study before launching it (:mod:`autotune.study.claims`)."""
        attrs: dict[str, Any] = {
            "config": config,
            "is_baseline": is_baseline,
            "deployment": self.deployment.name,
            "failure": None,
            "reason": None,
            "reused_from": None,
            "phase_seconds": {"restart": 0.0, "probe": 0.0, "warmup": 0.0, "measure": 0.0},
        }

        violations = self.space.violations(config)
        if violations:
            reason = "; ".join(f"{v.name}: {v.reason}" for v in violations)
            return failed_outcome(self.objective, attrs, failure="forbidden", reason=reason)

        specs = render(self.space, self.deployment, config, run_dir=self.run_dir)
        attrs["services"] = {
            name: {
                "command": spec.command_line(),
                "argv": list(spec.argv),
                "env": dict(spec.env),
                "unset_env": list(spec.unset_env),
                "fingerprint": spec.fingerprint(),
                "depends_on": list(spec.depends_on),
                "ready_timeout_s": spec.ready_timeout_s,
                "workdir": spec.workdir,
                "health_url": spec.health_url,
            }
            for name, spec in specs.items()
        }

        previous = None if fresh else self._known.get(self.space.config_key(config))
        if previous is None and claim_as is not None:
            previous = self._claim(config, claim_as)
        if previous is not None:
            return reused_outcome(self.study, previous, attrs, objective=self.objective)

        deadline = time.monotonic() + self.definition.trial_timeout_s

        def on_event(service: str, event: str) -> None:
            self._phase(f"restart: {service} {event}")
            failpoint(f"restart.{event}")

        self._phase("restart")
        t = time.monotonic()
        try:
            if fresh:
                # Each process draws its own speed (noise): a re-measurement must not keep
                # the processes of the measurement it repeats.
                self.launcher.stop_all()
            applied = self.launcher.apply(specs, on_event=on_event, deadline=deadline)
        except LaunchError as exc:
            attrs["phase_seconds"]["restart"] = time.monotonic() - t
            if exc.failure in NOT_THE_CONFIG:
                raise HostFailure(str(exc)) from None
            return failed_outcome(
                self.objective,
                attrs,
                failure=exc.failure,
                reason=f"{exc.service}: {exc.reason}",
                log_tail=exc.log_tail,
            )
        attrs["phase_seconds"]["restart"] = time.monotonic() - t
        attrs["restarted"] = list(applied.restarted)

        effective = applied.info
        attrs["effective"] = effective
        self._check_engine_version(effective, attrs)
        attrs["overrides"] = [
            line
            for name, spec in specs.items()
            if spec.settings_of in self.engines
            for line in find_overrides(
                {name: self.space.settings_for(spec.settings_of, config)},
                effective,
                manifest=self.engines[spec.settings_of].manifest,
            )
        ]

        endpoint = self.deployment.endpoint_url(specs)
        failpoint("probe")
        t = time.monotonic()
        wrong = self._check_output(endpoint, deadline=deadline)
        attrs["phase_seconds"]["probe"] = time.monotonic() - t
        if wrong is not None:
            return self._after_fault(specs, attrs, failure="wrong_output", reason=wrong)

        spec = self._load_spec()

        def on_phase(name: str) -> None:
            self._phase("warm-up" if name.startswith("warm") else name)
            if name.startswith("warm"):
                failpoint("warmup")

        def on_progress(done: int, total: int) -> None:
            if done == 1:
                failpoint("measure")

        try:
            result = run_load(
                endpoint,
                spec,
                on_phase=on_phase,
                on_progress=on_progress,
                deadline=deadline,
                abort_if=None if fresh else self._abort_rule(),
            )
        except BenchError as exc:
            failure = "trial_timeout" if time.monotonic() >= deadline else "bench_failed"
            return self._after_fault(
                specs,
                attrs,
                failure=failure,
                reason=str(exc),
                stalled=isinstance(exc, BenchTimeout),
            )
        died = self.launcher.check_alive(specs)
        if died is not None:
            return self._after_fault(specs, attrs, failure=died.failure, reason=str(died))
        attrs["phase_seconds"]["warmup"] = result.warmup_seconds
        attrs["phase_seconds"]["measure"] = result.measure_seconds
        # A simulated deployment may run faster than the hardware it models: figures are
        # stored in the modeled hardware's time.
        metrics = rescale_time(result.metrics, self.deployment.sim_speedup).model_dump(mode="json")
        attrs["sim_speedup"] = self.deployment.sim_speedup
        attrs["metrics"] = metrics
        if result.stop_reason:
            attrs["stop_reason"] = result.stop_reason
        if result.aborted:
            attrs["aborted"] = result.aborted
        if metrics["error_rate"] > self.definition.slo.max_error_rate:
            errors = ", ".join(f"{n}x {text}" for text, n in metrics["errors"].items())
            attrs["failure"] = "request_errors"
            attrs["reason"] = (
                f"{metrics['failed']} of {metrics['failed'] + metrics['completed']} requests "
                f"failed (error rate {metrics['error_rate']:.1%} > max_error_rate "
                f"{self.definition.slo.max_error_rate:.1%}): {errors}"
            )[:2000]
            self.launcher.stop_all()  # the next trial starts from fresh processes
        return TrialOutcome(
            values=self.objective.values(metrics),
            constraints=self.objective.constraints(metrics),
            attrs=attrs,
        )

    def _claim(self, config: dict[str, Any], number: int) -> int | None:
        """Claim ``config`` for trial ``number``: None when it is ours to launch, else the
        COMPLETE trial (another worker's) whose result it reuses.

        Raises :class:`ClaimedElsewhere` when the owner is still in flight.
        """
        key = claim_key(self.space.config_key(config))
        for _ in range(5):
            got = self._db("claiming the configuration", lambda: claim(self.study, key, number))
            if got.won:
                return None
            storage = self.study._storage
            owner = storage.get_trial(
                storage.get_trial_id_from_study_id_trial_number(self.study._study_id, got.owner)
            )
            if owner.state == TrialState.COMPLETE:
                self._known.setdefault(self.space.config_key(config), owner.number)
                return owner.number
            if owner.state == TrialState.FAIL:  # its worker died or was stopped: take it over
                if take_over(self.study, key, previous=owner.number, number=number):
                    return None
                continue
            raise ClaimedElsewhere(owner.number, owner.system_attrs.get(TRIAL_WORKER_ATTR))
        raise ClaimedElsewhere(number, None)

    def _abort_rule(self) -> AbortRule | None:
        """``abort_if`` for the load generator: the trial is clearly below the incumbent
        (:func:`early_abort_reason`)."""
        settings = self.definition.early_abort
        incumbent = self._incumbent
        if settings is None or incumbent is None or settings.abort_below * incumbent[0] <= 0:
            return None
        spec = self._load_spec()
        speedup = self.deployment.sim_speedup

        def abort_if(estimate: LiveEstimate) -> str | None:
            return early_abort_reason(
                estimate,
                settings=settings,
                incumbent=incumbent,
                streams=spec.streams,
                output_len=spec.output_len,
                speedup=speedup,
            )

        return abort_if

    def _after_fault(
        self,
        specs: Mapping[str, ServiceSpec],
        attrs: dict[str, Any],
        *,
        failure: str,
        reason: str,
        stalled: bool = False,
    ) -> TrialOutcome:
        """A trial that failed after its services were healthy: infeasible with the reason;
        every service is stopped so the next trial starts from fresh processes (a hung or
        half-dead server must not be kept because its flags did not change).

        The class comes from a service that died, else from what the live services' logs
        say (an OOM in a worker thread, torch.compile still running when a ``stalled`` load
        gave up), else it is ``failure``."""
        died = self.launcher.check_alive(specs)
        if died is not None and failure != died.failure:
            reason = f"{reason}; {died}"
            failure = died.failure
        if died is None:
            cause = explain_fault(
                self.launcher.log_tails(specs, lines=FAULT_SCAN_LINES), stalled=stalled
            )
            if cause is not None and cause.failure.value != failure:
                reason = f"{reason}; the log says: {cause.line}"
                failure = cause.failure.value
        tail = died.log_tail if died is not None else self.launcher.log_tails(specs)
        self.launcher.stop_all()
        return failed_outcome(self.objective, attrs, failure=failure, reason=reason, log_tail=tail)

    def _check_output(self, endpoint: str, *, deadline: float) -> str | None:
        """None when the greedy probe's text matches the reference, else the reason."""
        settings = self.definition.correctness
        if not settings.enabled:
            return None
        self._phase("correctness probe")
        try:
            text = probe_text(
                endpoint,
                prompt=settings.prompt,
                max_tokens=settings.max_tokens,
                model=self.deployment.model,
                deadline=deadline,
            )
        except BenchError as exc:
            return f"correctness probe failed: {exc}"
        reference = settings.expected or self.study.user_attrs.get(REFERENCE_ATTR)
        if reference is None:
            # The first healthy trial (the baseline: the deployment as it runs today) defines
            # what correct output looks like.
            self.study.set_user_attr(REFERENCE_ATTR, text)
            return None
        if text != reference:
            return (
                f"greedy output differs from the reference: got {text[:80]!r}, "
                f"expected {reference[:80]!r}"
            )
        return None
