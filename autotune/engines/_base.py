"""The engine plug-in point: what autotune must know about one serving engine.

An engine (SGLang, vLLM, ``transformers serve``, ...) is one subclass of :class:`BaseEngine`
plus a manifest generated from its real parser (``scripts/engines/manifest.py``). The contract
is narrow, in the style of Optuna's ``BaseSampler``: which options exist and how a command line
is checked (from the manifest), the failure patterns of its logs, its metric names, how its
``/server_info`` (or equivalent) maps back to flags and where its version is read, and its
request quirks. Nothing here launches anything; launchers, the load generator and the space
checks ask an engine, never the other way round.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from autotune.engines._manifest import Manifest, OptionInfo, load_manifest, split_value

FLAG_PATTERN = r"^--[A-Za-z0-9][A-Za-z0-9_.-]*$"
_FLAG_RE = re.compile(FLAG_PATTERN)
_NUMBER_RE = re.compile(r"^-\d|^-\.\d")

ProblemKind = Literal[
    "malformed",
    "unknown",
    "abbreviation",
    "ambiguous",
    "invalid_choice",
    "invalid_value",
    "missing_value",
    "unexpected_value",
    "deprecated",
    "unknown_env",
]


@dataclass(frozen=True)
class CommandProblem:
    """One thing the engine's parser would reject (``error``) or warn about (``warning``)."""

    kind: ProblemKind
    option: str
    """The token as written (``--cuda-graph-max-bs``, or the variable name)."""
    message: str
    suggestions: tuple[str, ...] = ()
    """The closest real options (or the allowed values)."""
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        text = self.message
        if self.suggestions:
            text += f" (closest: {', '.join(self.suggestions)})"
        return text


@dataclass(frozen=True)
class FailurePattern:
    """A log line that names why a start failed: ``failure`` is a stored failure class."""

    priority: int
    failure: str
    pattern: str


@dataclass(frozen=True)
class StartStage:
    """A log line that says the engine entered a stage of its start-up (``label``: what it
    is doing from then on, worded to follow "while", e.g. "capturing CUDA graphs").

    A failure line does not always say where the start was: vLLM's "CUDA out of memory.
    Tried to allocate 488 MiB" reads the same when the KV cache is allocated and when CUDA
    graphs are captured, and the levers that fix it differ (the KV cache's size against the
    graphs' sizes). The last stage line before the failure line names it.
    """

    pattern: str
    label: str


@dataclass(frozen=True)
class EngineMetrics:
    """The engine's Prometheus names for what autotune reads (``None``: not exported).

    The field names are the keys a trial stores (``server_metrics``), the same for every
    engine; :func:`autotune.engines._prometheus.summarize` turns a window of scrapes into
    them by the metric's type (counter: increase, histogram: mean, gauge: peak and mean).
    """

    running: str | None = None
    queued: str | None = None
    kv_usage: str | None = None
    prompt_tokens: str | None = None
    generation_tokens: str | None = None
    ttft: str | None = None
    tpot: str | None = None
    itl: str | None = None
    e2e: str | None = None
    queue_time: str | None = None
    preemptions: str | None = None
    prefix_cache_hits: str | None = None
    prefix_cache_queries: str | None = None
    spec_accepted: str | None = None
    spec_drafted: str | None = None
    spec_accept_length: str | None = None

    def names(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class RequestQuirks:
    """How the OpenAI-compatible endpoint of this engine must be spoken to.

    ``ignore_eos``: the value to send (``None``: leave the field out, a server that refuses
    unknown fields); ``require_done``: streams end with ``data: [DONE]``; ``prompt``: the
    prompt form it takes (``None``: token ids for completions); ``pin_model``: each request
    must name the served model (the server loads models by name).
    """

    ignore_eos: bool | None = True
    require_done: bool = True
    prompt: Literal["token_ids", "text"] | None = None
    pin_model: bool = False


class BaseEngine(abc.ABC):
    """One serving engine at one version.

    Subclasses set the class attributes and, where the engine differs, override
    :meth:`version_from` and :meth:`flags_from_server_info`. The option checks come from the
    manifest and are the same for every argparse/click engine.
    """

    name: ClassVar[str]
    """Registry name, as a space's ``engine: {name: ...}`` spells it."""
    default_version: ClassVar[str | None] = None
    programs: ClassVar[tuple[str, ...]] = ()
    """How a command that runs this engine starts (``sglang.launch_server`` after ``-m``,
    ``vllm serve``): what tells a deployment's service which engine it is. The simulated
    SGLang server counts as SGLang: it takes SGLang's options."""
    env_prefixes: ClassVar[tuple[str, ...]] = ()
    """Variables with these prefixes are checked against the manifest's variable registry."""
    scratch_env: ClassVar[tuple[str, ...]] = ()
    """Variables that name where the engine puts files it never removes (vLLM's ZMQ socket
    files, about 7 a start, in the system temp directory even after a clean stop): the
    service manager points them at a directory of the service's own, emptied at each start
    and removed once the service has stopped (:attr:`autotune.specs.ServiceSpec.scratch_env`).
    A deployment that sets one itself keeps its value."""
    failure_patterns: ClassVar[tuple[FailurePattern, ...]] = ()
    start_stages: ClassVar[tuple[StartStage, ...]] = ()
    metrics: ClassVar[EngineMetrics] = EngineMetrics()
    quirks: ClassVar[RequestQuirks] = RequestQuirks()
    version_path: ClassVar[str | None] = None
    """Where a running server says its version (``/server_info``, ``/version``)."""
    cache_flush_path: ClassVar[str | None] = None
    """``POST`` here empties the server's prefix cache (SGLang ``/flush_cache``): a server
    kept from the previous trial must not answer this trial's prompts from its cache."""

    def __init__(self, *, version: str | None = None) -> None:
        self.version = version or self.default_version

    def __repr__(self) -> str:
        return f"{type(self).__name__}(version={self.version!r})"

    # ------------------------------------------------------------------ options

    @property
    def manifest(self) -> Manifest | None:
        """The options of this release; ``None`` when the engine is not checked."""
        if self.version is None:
            return None
        return load_manifest(self.name, self.version)

    def check_flag(self, flag: str) -> CommandProblem | None:
        """Why ``flag`` (a name, no value) must not be emitted; ``None`` when it is fine."""
        if not _FLAG_RE.fullmatch(flag):
            return CommandProblem(
                "malformed",
                flag,
                f"'{flag}' is not a long-form flag: it must start with '--' followed by a name "
                "(no '=value', no single-dash short options)",
            )
        manifest = self.manifest
        if manifest is None:
            return None
        found = manifest.resolve(flag)
        where = f"{self.name} {manifest.version}"
        if found.status == "exact":
            option = found.option
            assert option is not None
            if option.deprecated:
                hint = f"; use {option.replacement}" if option.replacement else ""
                severity: Literal["error", "warning"] = "error" if option.error else "warning"
                return CommandProblem(
                    "deprecated",
                    flag,
                    f"{flag} is deprecated in {where}{hint}",
                    severity=severity,
                )
            return None
        if found.status == "abbreviation":
            return CommandProblem(
                "abbreviation",
                flag,
                f"{flag} is an abbreviation of {found.candidates[0]} ({where}'s parser would "
                "expand it silently, and a later release can make it ambiguous); write it in full",
                found.candidates,
            )
        if found.status == "ambiguous":
            return CommandProblem(
                "ambiguous",
                flag,
                f"ambiguous option {flag} in {where}: could match {', '.join(found.candidates)}",
                found.candidates,
            )
        return CommandProblem(
            "unknown", flag, f"unknown option {flag} in {where}", found.candidates
        )

    def check_values(self, flag: str, values: Sequence[str]) -> CommandProblem | None:
        """Why ``values`` after the exact option ``flag`` would be refused, or ``None``."""
        manifest = self.manifest
        option = None if manifest is None else manifest.option(flag)
        if option is None:
            return None
        return _value_problem(option, flag, list(values), where=f"{self.name} {self.version}")

    def check_env(self, name: str) -> CommandProblem | None:
        """A variable with this engine's prefix that this release does not declare."""
        manifest = self.manifest
        if manifest is None or manifest.env_names is None:
            return None
        if not name.startswith(self.env_prefixes) or name in manifest.env_names:
            return None
        return CommandProblem(
            "unknown_env",
            name,
            f"{name} is not a variable {self.name} {manifest.version} reads",
            manifest.closest_env(name),
        )

    def check_command(self, argv: Sequence[str]) -> list[CommandProblem]:
        """Every problem of a rendered command (program first; options from the first
        ``--flag``), read with the parser's rules: ``--x=v``, prefixes, nargs, choices."""
        return self.check_options(argv[self.options_start(argv) :])

    def options_start(self, argv: Sequence[str]) -> int:
        """Where the engine's own options begin: the first ``--flag`` after the program
        (``numactl --membind=1 python -m sglang.launch_server --tp-size 4``: ``--tp-size``)."""
        after = self.program_end(argv) or 0
        return next((i for i in range(after, len(argv)) if argv[i].startswith("--")), len(argv))

    @classmethod
    def program_end(cls, argv: Sequence[str]) -> int | None:
        """The index just past this engine's program in ``argv``; ``None`` when ``argv``
        does not run it."""
        names = [t.rsplit("/", 1)[-1] for t in argv]
        for marker in cls.programs:
            words = marker.split()
            for i in range(len(names) - len(words) + 1):
                if names[i : i + len(words)] == words:
                    return i + len(words)
        return None

    def check_options(self, options: Sequence[str]) -> list[CommandProblem]:
        problems: list[CommandProblem] = []
        manifest = self.manifest
        i = 0
        tokens = list(options)
        while i < len(tokens):
            token = tokens[i]
            if token == "--":
                break
            if not token.startswith("--"):
                problems.append(
                    CommandProblem("unexpected_value", token, f"unexpected argument {token!r}")
                )
                i += 1
                continue
            flag, inline = split_value(token)
            problem = self.check_flag(flag)
            if problem is not None:
                problems.append(problem)
            option = None
            if manifest is not None:
                found = manifest.resolve(flag)
                option = found.option if found.status in ("exact", "abbreviation") else None
            if option is None:  # unknown: skip what looks like its values
                i += 1
                while i < len(tokens) and not tokens[i].startswith("--"):
                    i += 1
                continue
            if inline is not None:
                values = [inline]
                i += 1
            else:
                values = _take_values(tokens, i, option)
                i += 1 + len(values)
            value_problem = _value_problem(
                option, flag, values, where=f"{self.name} {self.version}", inline=inline
            )
            if value_problem is not None:
                problems.append(value_problem)
        return problems

    # ------------------------------------------------------------------ a running server

    def version_from(self, payload: Mapping[str, Any]) -> str | None:
        """The version a running server reports in the answer of :attr:`version_path`."""
        value = payload.get("version")
        return str(value) if value is not None else None

    def version_mismatch(self, service: str, payload: Mapping[str, Any]) -> str | None:
        """A warning naming both versions when a running server is not the release whose
        options the space was checked against (``None`` when they agree or it does not say)."""
        running = self.version_from(payload)
        if running is None or self.version is None or running == self.version:
            return None
        return (
            f"{service} runs {self.name} {running}, but the space's options were checked "
            f"against {self.name} {self.version}: regenerate the manifest "
            f"(scripts/engines/manifest.py generate {self.name} {running}) and set "
            f'engine: {{name: {self.name}, version: "{running}"}}'
        )

    def flags_from_server_info(self, info: Mapping[str, Any]) -> dict[str, Any]:
        """Resolved fields of ``/server_info`` keyed by the flag that sets each one."""
        manifest = self.manifest
        if manifest is None:
            return {}
        out: dict[str, Any] = {}
        for key, value in info.items():
            option = manifest.option_for_dest(key)
            if option is not None:
                out[option.name] = value
        return out


def _take_values(tokens: Sequence[str], i: int, option: OptionInfo) -> list[str]:
    if not option.takes_value:
        return []
    rest = tokens[i + 1 :]

    def is_value(t: str) -> bool:
        return not t.startswith("-") or bool(_NUMBER_RE.match(t))

    if isinstance(option.nargs, int):
        return [t for t in rest[: option.nargs] if is_value(t)]
    if option.nargs in (None, "?"):
        return list(rest[:1]) if rest and is_value(rest[0]) else []
    out = []
    for t in rest:
        if not is_value(t):
            break
        out.append(t)
    return out


def _value_problem(
    option: OptionInfo,
    flag: str,
    values: list[str],
    *,
    where: str,
    inline: str | None = None,
) -> CommandProblem | None:
    if not option.takes_value:
        if inline is not None:
            return CommandProblem(
                "unexpected_value", flag, f"{flag} takes no value in {where}, got {inline!r}"
            )
        return None
    wanted = option.nargs
    if wanted in (None, "+") and not values:
        return CommandProblem("missing_value", flag, f"{flag} expects a value in {where}")
    if isinstance(wanted, int) and len(values) != wanted:
        return CommandProblem(
            "missing_value", flag, f"{flag} expects {wanted} values in {where}, got {len(values)}"
        )
    for value in values:
        if not option.allows(value):
            return CommandProblem(
                "invalid_choice",
                flag,
                f"{flag}: invalid choice {value!r} in {where}",
                tuple(str(c) for c in option.choices or ()),
            )
        if option.type in ("int", "float"):
            try:
                int(value) if option.type == "int" else float(value)
            except ValueError:
                return CommandProblem(
                    "invalid_value",
                    flag,
                    f"{flag}: invalid {option.type} value {value!r} in {where}",
                )
    return None
