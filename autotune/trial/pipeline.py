"""One trial, from a configuration to a scored record: check -> render -> launch -> probe ->
warm-up -> measure -> score.

The pipeline knows nothing of Optuna or of the study: it is given a configuration and
returns a :class:`~autotune.trial.record.TrialOutcome`; the study loop
(:mod:`autotune.study.runner`) asks the sampler for configurations, decides which need a
launch at all (an identical one already measured, or claimed by another worker) and tells
the storage. So every step of the README's data flow can be run and tested on its own, with
a fake launcher, and a new kind of study (a sweep, an ablation) reuses it as it is.

Faults: one deadline per trial (``trial_timeout_s``) caps restart, probe and load; a service
that dies while measured makes the trial infeasible (``crashed`` or the class its log shows)
and every service is stopped so the next trial starts from fresh processes; so does a hung
or half-dead server, whatever its flags. What broke it is found by :mod:`.faults`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from autotune.cpus import available_cpus, format_cpu_list, pinned
from autotune.deployment import Deployment
from autotune.engines import BaseEngine
from autotune.errors import AutotuneError, BenchError, BenchTimeout, LaunchError
from autotune.failpoints import failpoint
from autotune.failures import NOT_THE_CONFIG, Failure
from autotune.launch import Launcher, ServiceStartup
from autotune.loadgen import AbortRule, LoadSpec, probe_text
from autotune.render import render
from autotune.space import SearchSpace
from autotune.specs import ServiceSpec
from autotune.telemetry import TelemetrySampler, gpu_sampler
from autotune.trial.effective import find_overrides
from autotune.trial.faults import cause_in_logs, death_behind_errors
from autotune.trial.inherited_env import inherited_env
from autotune.trial.measurement import MeasurePlan
from autotune.trial.measurement import measure as measure_deployment
from autotune.trial.record import ServiceRecord, TrialOutcome, TrialRecord
from autotune.trial.server_metrics import ServerMetricsWatch, on_modeled_clock


class HostFailure(AutotuneError):
    """A host could not be reached: the run stops; the trial's config is retried on resume."""


class Unscorable(AutotuneError):
    """Raised by :meth:`Scorer.values`: the trial was measured, but the figure the objective
    needs is missing (J/token without GPU telemetry). The trial is infeasible with
    ``failure`` and this reason, never scored as a zero that would look like a result."""

    def __init__(self, reason: str, *, failure: str) -> None:
        super().__init__(reason)
        self.failure = failure


class Scorer(Protocol):
    """From measured metrics to the objective's values and the constraint values
    (:meth:`values` may raise :class:`Unscorable`)."""

    def values(self, metrics: Mapping[str, Any]) -> list[float]: ...
    def constraints(self, metrics: Mapping[str, Any]) -> dict[str, float]: ...
    def failed_values(self) -> list[float]: ...
    def failed_constraints(self) -> dict[str, float]: ...


class ReferenceOutput(Protocol):
    """Where the correctness reference lives (the study keeps it; a test, a dict)."""

    def get(self) -> str | None: ...
    def set(self, text: str) -> None: ...


@dataclass(frozen=True)
class ProbeSettings:
    """The greedy correctness probe: its text must equal the reference."""

    enabled: bool = True
    prompt: str = "Explain in one sentence why the sky is blue."
    max_tokens: int = 16
    expected: str | None = None
    """Exact expected text; None: the first healthy trial's text becomes the reference."""


@dataclass(frozen=True)
class PipelineSettings:
    trial_timeout_s: float
    max_error_rate: float = 0.0
    probe: ProbeSettings = ProbeSettings()


@dataclass
class Prepared:
    """A configuration checked and rendered: what a launch would start."""

    config: dict[str, Any]
    specs: dict[str, ServiceSpec]
    record: TrialRecord


def failed(
    scorer: Scorer, record: TrialRecord, *, failure: str, reason: str, log_tail: str = ""
) -> TrialOutcome:
    """An infeasible outcome (forbidden, crashed, wrong output, ...): the failure class, its
    reason and the log tail on ``record``; the objective's failed values."""
    record.failure = str(failure)
    record.reason = reason
    record.log_tail = log_tail
    return TrialOutcome(
        values=scorer.failed_values(), constraints=scorer.failed_constraints(), record=record
    )


def service_records(
    specs: Mapping[str, ServiceSpec],
    engines: Mapping[str, BaseEngine] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> dict[str, ServiceRecord]:
    """What each service of a trial runs; with ``engines`` (by the space's service name),
    also what a local service inherits from ``environ`` (default: autotune's environment)
    that its engine reads."""
    return {
        name: ServiceRecord(
            command=spec.command_line(),
            argv=list(spec.argv),
            env=dict(spec.env),
            unset_env=list(spec.unset_env),
            fingerprint=spec.fingerprint(),
            depends_on=list(spec.depends_on),
            ready_timeout_s=spec.ready_timeout_s,
            workdir=spec.workdir,
            health_url=spec.health_url,
            inherited_env=(
                None
                if engines is None
                else inherited_env(spec, engines.get(spec.settings_of), environ=environ)
            ),
        )
        for name, spec in specs.items()
    }


class TrialPipeline:
    """Evaluates configurations of ``space`` on ``deployment`` through ``launcher``."""

    def __init__(
        self,
        *,
        space: SearchSpace,
        deployment: Deployment,
        launcher: Launcher,
        scorer: Scorer,
        load: LoadSpec,
        settings: PipelineSettings,
        reference: ReferenceOutput,
        plan: MeasurePlan | None = None,
        engines: Mapping[str, BaseEngine],
        run_dir: Any,
        on_phase: Callable[[str], None] = lambda name: None,
        on_warning: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.space = space
        self.deployment = deployment
        self.launcher = launcher
        self.scorer = scorer
        self.load = load
        self.settings = settings
        self.plan = (plan or MeasurePlan()).on_wall_clock(deployment.sim_speedup)
        """What each trial measures (a capacity search, a curve), on the wall clock."""
        self.reference = reference
        self.engines = dict(engines)
        """Per space service: the engine it runs (versions, option spellings)."""
        self.run_dir = run_dir
        self.on_phase = on_phase
        self.on_warning = on_warning
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ steps

    def prepare(self, config: dict[str, Any], *, is_baseline: bool) -> Prepared | TrialOutcome:
        """Check and render ``config``: a forbidden one is an outcome at once (nothing is
        launched), else what :meth:`measure` would start."""
        record = TrialRecord(
            config=config, is_baseline=is_baseline, deployment=self.deployment.name
        )
        violations = self.space.violations(config)
        if violations:
            record.violations = [v.name for v in violations]
            reason = "; ".join(f"{v.name}: {v.reason}" for v in violations)
            return failed(self.scorer, record, failure=Failure.forbidden, reason=reason)
        specs = render(self.space, self.deployment, config, run_dir=self.run_dir)
        record.services = service_records(specs, self.engines)
        return Prepared(config=config, specs=specs, record=record)

    def measure(
        self, prepared: Prepared, *, fresh: bool = False, abort_if: AbortRule | None = None
    ) -> TrialOutcome:
        """Launch, probe and load a prepared configuration; ``fresh``: every service is
        started anew (a re-measurement must not keep the processes it repeats, each of which
        draws its own speed)."""
        record, specs = prepared.record, prepared.specs
        phases = record.phase_seconds
        deadline = time.monotonic() + self.settings.trial_timeout_s

        def on_event(service: str, event: str) -> None:
            self.on_phase(f"restart: {service} {event}")
            failpoint(f"restart.{event}")

        self.on_phase("restart")
        t = time.monotonic()
        try:
            if fresh:
                self.launcher.stop_all()
            applied = self.launcher.apply(specs, on_event=on_event, deadline=deadline)
        except LaunchError as exc:
            phases["restart"] = time.monotonic() - t
            if exc.failure in NOT_THE_CONFIG:
                raise HostFailure(str(exc)) from None
            if exc.startup is not None:
                record.startup = {exc.service: ServiceStartup.model_validate(exc.startup)}
            return failed(
                self.scorer,
                record,
                failure=exc.failure,
                reason=f"{exc.service}: {exc.reason}",
                log_tail=exc.log_tail,
            )
        phases["restart"] = time.monotonic() - t
        record.restarted = list(applied.restarted)
        if applied.startup:
            record.startup = dict(applied.startup)
        record.effective = dict(applied.info)
        self._read_back(prepared, record)

        if self._prompts_can_share_prefixes():
            kept = set(specs) - set(applied.restarted)
            self._flush_kept_caches(specs, kept=kept, record=record)
        endpoint = self.deployment.endpoint_url(specs)
        failpoint("probe")
        t = time.monotonic()
        wrong = self._check_output(endpoint, deadline=deadline)
        phases["probe"] = time.monotonic() - t
        if wrong is not None:
            return self._after_fault(specs, record, failure=Failure.wrong_output, reason=wrong)

        watch = self._metrics_watch(specs)
        gpus = self._gpu_sampler(specs)

        def on_load_phase(name: str) -> None:
            self.on_phase("warm-up" if name.startswith("warm") else name)
            if name.startswith("warm"):
                failpoint("warmup")
            if name == "measure":
                watch.begin()
                gpus.begin()  # last: its window starts where the load does

        def on_curve() -> None:
            gpus.end()  # a curve swept after the measurement is not in its energy
            self.on_phase("curve")

        def on_progress(done: int, total: int) -> None:
            if done == 1:
                failpoint("measure")

        bench_error: BenchError | None = None
        speedup = self.deployment.sim_speedup
        client_cpus = self.deployment.client_cpu_set()
        with watch, gpus:  # the sampling threads never outlive the load, Ctrl-C included
            try:
                with pinned(client_cpus):  # started first: the sampler keeps every core
                    if client_cpus is not None:
                        record.client_cpus = format_cpu_list(available_cpus())
                    result = measure_deployment(
                        endpoint,
                        self.load,
                        self.plan,
                        speedup=speedup,
                        deadline=deadline,
                        on_phase=on_load_phase,
                        on_progress=on_progress,
                        abort_if=None if fresh else abort_if,
                        on_curve=on_curve,
                    )
            except BenchError as exc:
                bench_error = exc
        if watch.summary:
            record.server_metrics = on_modeled_clock(watch.summary, self.deployment.sim_speedup)
        telemetry = gpus.end()
        if telemetry is not None:
            record.telemetry = telemetry
        if bench_error is not None:
            timed_out = time.monotonic() >= deadline
            return self._after_fault(
                specs,
                record,
                failure=Failure.trial_timeout if timed_out else Failure.bench_failed,
                reason=str(bench_error),
                stalled=isinstance(bench_error, BenchTimeout),
            )
        died = self.launcher.check_alive(specs)
        if died is None and result.metrics.failed:
            died = death_behind_errors(self.launcher, specs)
        if died is not None:
            return self._after_fault(
                specs, record, failure=died.failure, reason=str(died), died=died
            )
        phases["warmup"] = result.warmup_seconds
        phases["measure"] = result.measure_seconds
        # A simulated deployment may run faster than the hardware it models: figures are
        # stored in the modeled hardware's time (measurement.py converts them).
        metrics = result.metrics.model_dump(mode="json")
        record.sim_speedup = speedup
        record.metrics = metrics
        if result.capacity is not None:
            record.capacity = result.capacity
        if result.curve:
            record.curve = result.curve
        if result.stop_reason:
            record.stop_reason = result.stop_reason
        if result.aborted:
            record.aborted = result.aborted
        if telemetry is not None:
            record.telemetry = telemetry = telemetry.with_tokens(result.output_tokens)
        limit = self.settings.max_error_rate
        if metrics["error_rate"] > limit:
            errors = ", ".join(f"{n}x {text}" for text, n in metrics["errors"].items())
            record.failure = Failure.request_errors.value
            record.reason = (
                f"{metrics['failed']} of {metrics['failed'] + metrics['completed']} requests "
                f"failed (error rate {metrics['error_rate']:.1%} > max_error_rate "
                f"{limit:.1%}): {errors}"
            )[:2000]
            self.launcher.stop_all()  # the next trial starts from fresh processes
        scored = result.score_inputs(metrics)
        if telemetry is not None:
            scored = {**scored, **telemetry.score_inputs()}
        try:
            values = self.scorer.values(scored)
        except Unscorable as exc:  # request_errors, when set, stays the trial's fault
            failure, reason = record.failure or exc.failure, record.reason or str(exc)
            return failed(self.scorer, record, failure=failure, reason=reason)
        return TrialOutcome(
            values=values, constraints=self.scorer.constraints(scored), record=record
        )

    def evaluate(
        self,
        config: dict[str, Any],
        *,
        is_baseline: bool = False,
        fresh: bool = False,
        abort_if: AbortRule | None = None,
    ) -> TrialOutcome:
        """:meth:`prepare` then, unless forbidden, :meth:`measure`."""
        prepared = self.prepare(config, is_baseline=is_baseline)
        if isinstance(prepared, TrialOutcome):
            return prepared
        return self.measure(prepared, fresh=fresh, abort_if=abort_if)

    # ------------------------------------------------------------------ helpers

    def _prompts_can_share_prefixes(self) -> bool:
        """Whether a cache kept from the last trial could serve this one's prompts: random
        prompts share no page of a prefix cache (``tests/sim/test_prefix_cache.py``), so
        they need no flush (which waits for the server to drain)."""
        dataset = self.load.dataset
        return dataset is not None and dataset.kind != "random"

    def _flush_kept_caches(
        self, specs: Mapping[str, ServiceSpec], *, kept: set[str], record: TrialRecord
    ) -> None:
        """Empty the prefix caches of the services kept from the previous trial, so that
        every trial starts from an empty cache as a restarted server does (kept ones would
        otherwise hold the previous trial's prompts, which are this trial's too). A server
        that refuses says so once; the trial goes on."""
        for name in sorted(kept):
            spec = specs[name]
            engine = self.engines.get(spec.settings_of)
            path = engine.cache_flush_path if engine is not None else None
            if path is None or not spec.health_url:
                continue
            parts = urlsplit(spec.health_url)
            url = f"{parts.scheme}://{parts.netloc}{path}"
            try:
                response = httpx.post(url, params={"timeout": "10"}, timeout=15.0)
                ok = response.status_code == 200
                why = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if ok:
                record.cache_flushed.append(name)
                continue
            warning = f"warning: {name}: could not empty its prefix cache ({url}: {why})"
            if warning not in self._warned:
                self._warned.add(warning)
                self.on_warning(warning)

    def _gpu_sampler(self, specs: Mapping[str, ServiceSpec]) -> TelemetrySampler:
        """NVML over the GPUs the services use, opened now (before the warm-up: opening
        is not free); a machine or deployment that cannot be measured says why, once."""
        sampler = gpu_sampler(specs, cpus=self.deployment.services_cpu_set())
        warning = f"GPU telemetry: none ({sampler.none_reason}); trials record that"
        if sampler.none_reason is not None and warning not in self._warned:
            self._warned.add(warning)
            self.on_warning(warning)
        return sampler

    def _metrics_watch(self, specs: Mapping[str, ServiceSpec]) -> ServerMetricsWatch:
        """A watch over every service that has a ``metrics_url`` and an engine that names
        its metrics (a simulated or generic server without them is left out)."""
        targets = {}
        for name, spec in specs.items():
            engine = self.engines.get(spec.settings_of)
            if spec.metrics_url and engine is not None:
                targets[name] = (spec.metrics_url, engine.metrics)
        return ServerMetricsWatch(targets, cpus=self.deployment.services_cpu_set())

    def _read_back(self, prepared: Prepared, record: TrialRecord) -> None:
        """What the servers say they run: the engine version (warned once when it is not
        the space's release) and the tuned values they silently rewrote (``overrides``)."""
        effective = record.effective
        versions: dict[str, str] = {}
        overrides: list[str] = []
        for name, spec in prepared.specs.items():
            engine = self.engines.get(spec.settings_of)
            info = effective.get(name)
            if engine is None:
                continue
            if info:
                version = engine.version_from(info)
                if version is not None:
                    versions[name] = version
                warning = engine.version_mismatch(name, info)
                if warning is not None and warning not in self._warned:
                    self._warned.add(warning)
                    self.on_warning(f"warning: {warning}")
            overrides += find_overrides(
                {name: self.space.settings_for(spec.settings_of, prepared.config)},
                effective,
                manifest=engine.manifest,
            )
        if versions:
            record.engine_version = versions
        record.overrides = overrides

    def _after_fault(
        self,
        specs: Mapping[str, ServiceSpec],
        record: TrialRecord,
        *,
        failure: str,
        reason: str,
        stalled: bool = False,
        died: LaunchError | None = None,
    ) -> TrialOutcome:
        """A trial that failed after its services were healthy: infeasible with the reason;
        every service is stopped so the next trial starts from fresh processes.

        The class comes from a service that died, else from what the live services' logs
        say (an OOM in a worker thread, torch.compile still running when a ``stalled`` load
        gave up), else it is ``failure``. ``died``: the death the caller already found
        (:meth:`Launcher.check_alive` is not asked twice)."""
        failure = str(failure)
        cause = None
        if died is None:
            died, cause = cause_in_logs(self.launcher, specs, stalled=stalled)
        if died is not None and failure != died.failure:
            reason = f"{reason}; {died}"
            failure = died.failure
        if cause is not None and cause.failure.value != failure:
            reason = f"{reason}; the log says: {cause.line}"
            failure = cause.failure.value
        tail = died.log_tail if died is not None else self.launcher.log_tails(specs)
        self.launcher.stop_all()
        return failed(self.scorer, record, failure=failure, reason=reason, log_tail=tail)

    def _check_output(self, endpoint: str, *, deadline: float) -> str | None:
        """None when the greedy probe's text matches the reference, else the reason."""
        probe = self.settings.probe
        if not probe.enabled:
            return None
        self.on_phase("correctness probe")
        try:
            text = probe_text(
                endpoint,
                prompt=probe.prompt,
                max_tokens=probe.max_tokens,
                model=self.deployment.model,
                deadline=deadline,
            )
        except BenchError as exc:
            return f"correctness probe failed: {exc}"
        reference = probe.expected or self.reference.get()
        if reference is None:
            # The first healthy trial (the baseline: the deployment as it runs today) defines
            # what correct output looks like.
            self.reference.set(text)
            return None
        if text != reference:
            return (
                f"greedy output differs from the reference: got {text[:80]!r}, "
                f"expected {reference[:80]!r}"
            )
        return None
