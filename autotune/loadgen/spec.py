"""What load to apply: the closed-loop benchmark definition and its SLOs.

One :class:`LoadSpec` fixes everything that changes a measurement (concurrency, lengths,
how many requests, prompt form, sampling), so two trials measured with equal specs are
comparable. Defaults follow DOMAIN.md §3 (random dataset, fixed lengths, ``ignore_eos``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from autotune.errors import ConfigError
from autotune.loadgen.datasets import DatasetSpec, RandomDataset

MAX_TOKENS = 1 << 20
"""Longest input or output a load may ask for (prompts are built in memory)."""
MAX_REQUESTS = 1_000_000

Api = Literal["completions", "chat"]
PromptKind = Literal["token_ids", "text"]


class SLO(BaseModel):
    """Service-level objectives in milliseconds; unset ones are not checked.

    Per request, goodput counts requests meeting every set limit. Across the run,
    :func:`autotune.loadgen.metrics.slo_margins` compares the ``percentile`` of each
    latency with its limit (the constraint form the study uses).
    """

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)
    percentile: float = Field(default=99.0, gt=0, le=100)

    def limits(self) -> dict[str, float]:
        """Set limits by metric name (``ttft_ms``, ``tpot_ms``, ``e2e_ms``)."""
        pairs = (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2e_ms", self.e2e_ms))
        return {name: value for name, value in pairs if value is not None}


class LoadSpec(BaseModel):
    """A benchmark: closed loop at ``concurrency``, or open loop at ``request_rate``.

    Closed loop (``request_rate`` unset): C workers, each sends its next request when its
    last one finished, so the server never sees more than C. Open loop: requests arrive on
    a Poisson (``burstiness`` 1) or gamma schedule at ``request_rate`` req/s whether or not
    earlier ones have finished, at most ``max_concurrency`` in flight if set (SGLang
    ``bench_serving`` / ``vllm bench serve`` ``--request-rate --burstiness
    --max-concurrency``); ``concurrency`` then only sizes the warm-up.

    Stop rule: exactly one of ``requests`` (measured count) or ``duration_s`` (stop
    dispatching after that many seconds, let in-flight requests finish). ``max_duration_s``
    caps the measure phase hard; requests still running then are cancelled and not counted.
    Giving ``duration_s`` alone clears the default ``requests``.

    Adaptive (``target_rel_ci``): measure until the 95% confidence interval of the output
    throughput is that tight relative to its mean (see :mod:`autotune.loadgen.estimate`),
    then stop dispatching and let in-flight requests finish; ``requests``, if given, is then
    a minimum count, ``min_duration_s`` a minimum time, ``max_duration_s`` still the cap.
    Giving ``target_rel_ci`` without ``requests`` clears the default ``requests``.
    """

    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(default=16, ge=1, le=65536)
    dataset: DatasetSpec | None = None
    """What the requests ask (:mod:`autotune.loadgen.datasets`: ``random`` with a range
    ratio, ``sharegpt`` from a file, ``shared_prefix``); ``None``: random prompts of exactly
    ``input_len`` tokens asking for ``output_len``."""
    tokenizer: str | None = None
    """A local tokenizer (directory or ``tokenizer.json``; never the hub) that counts and
    builds prompt lengths; ``None`` counts words."""
    request_rate: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
    """Open loop: mean arrivals per second (wall clock of the server measured)."""
    burstiness: float = Field(default=1.0, gt=0, le=1000, allow_inf_nan=False)
    """Gamma shape of the inter-arrival times: 1 Poisson, < 1 burstier, > 1 more regular."""
    max_concurrency: int | None = Field(default=None, ge=1, le=65536)
    """Open loop: requests in flight at most; a due request waits for a slot."""
    input_len: int = Field(default=256, ge=1, le=MAX_TOKENS)
    output_len: int = Field(default=32, ge=1, le=MAX_TOKENS)
    warmup_requests: int | None = Field(default=None, ge=0, le=MAX_REQUESTS)
    """Discarded requests before measuring; ``None`` means one per worker (= concurrency)."""
    requests: int | None = Field(default=64, ge=1, le=MAX_REQUESTS)
    duration_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_duration_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    target_rel_ci: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    """Stop measuring once the 95% CI half-width / mean of output throughput is <= this."""
    min_duration_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """Measure time before which neither the adaptive stop nor ``abort_if`` may end it."""
    api: Api = "completions"
    model: str | None = None
    """Model name sent with each request; ``None`` asks ``GET /v1/models`` once."""
    request_timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    prompt: PromptKind | None = None
    """``token_ids`` (exact input length; completions only) or ``text`` (``input_len``
    words); ``None`` picks token_ids for completions, text for chat."""
    temperature: float = Field(default=0.0, ge=0)
    ignore_eos: bool | None = True
    """Sent with every request (generate exactly ``output_len`` tokens); ``None`` leaves the
    field out, for servers that refuse fields OpenAI does not define (transformers serve)."""
    require_done: bool = True
    """A stream must end with ``data: [DONE]``; False also accepts a clean end after a
    chunk with a ``finish_reason`` (servers that send no ``[DONE]``: transformers serve)."""
    seed: int = 0
    """Seeds the random prompts: equal seeds send equal prompts."""
    slo: SLO = Field(default_factory=SLO)  # type: ignore[arg-type]

    _given: frozenset[str] = PrivateAttr(default=frozenset())

    @property
    def requests_dataset(self) -> DatasetSpec:
        """The dataset the requests come from (``input_len``/``output_len`` when unset)."""
        if self.dataset is not None:
            return self.dataset
        return RandomDataset(input_len=self.input_len, output_len=self.output_len)

    @property
    def max_output_len(self) -> int | None:
        """The most output tokens one request may ask for, or None when the data decides
        without a bound. The top-level ``output_len`` is not it once a dataset is given
        (issue 28: a study of outputs 64-512 was judged by the default 32, so the early
        abort's first-round bound was 16x too low and cut fast configurations on the H200)."""
        ds = self.requests_dataset
        fixed = getattr(ds, "output_len", None)
        if fixed is not None:
            return int(fixed)
        total = getattr(ds, "max_total_len", None)
        return int(total) if total is not None else None

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None

    @property
    def streams(self) -> int:
        """The closed loop's workers: the concurrency, or fewer when a fixed count of
        requests is smaller (an open loop's in-flight count is the server's business)."""
        if self.requests is None or self.target_rel_ci is not None:
            return self.concurrency
        return min(self.concurrency, self.requests)

    @model_validator(mode="before")
    @classmethod
    def _duration_clears_requests(cls, data: Any) -> Any:
        if (
            isinstance(data, Mapping)
            and (data.get("duration_s") is not None or data.get("target_rel_ci") is not None)
            and "requests" not in data
        ):
            data = {**data, "requests": None}
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _remember_given(cls, data: Any, handler: Any) -> Any:
        """Keep which fields the caller gave: a study completes the rest from the engine's
        request quirks (``prompt``, ``ignore_eos``, ...), and validation itself fills some."""
        given = frozenset(data) if isinstance(data, Mapping) else None
        spec = handler(data)
        if given is not None:
            spec._given = given
        return spec

    @property
    def given(self) -> frozenset[str]:
        """The fields set by whoever built this spec (a study file's ``load:`` keys)."""
        return self._given

    @model_validator(mode="after")
    def _resolve(self) -> LoadSpec:
        # PydanticCustomError with a "field": a study file's error names load.FIELD.
        if self.min_duration_s > self.max_duration_s:
            raise PydanticCustomError(
                "min_duration",
                "min_duration_s ({minimum}) exceeds max_duration_s ({limit})",
                {
                    "minimum": f"{self.min_duration_s:g}",
                    "limit": f"{self.max_duration_s:g}",
                    "field": "min_duration_s",
                },
            )
        if self.target_rel_ci is not None and self.duration_s is not None:
            raise PydanticCustomError(
                "stop_rule",
                "duration_s and target_rel_ci exclude each other (with target_rel_ci, bound "
                "the measure phase with min_duration_s and max_duration_s)",
                {"field": "target_rel_ci"},
            )
        if self.target_rel_ci is None and (self.requests is None) == (self.duration_s is None):
            both = self.requests is not None
            raise PydanticCustomError(
                "stop_rule",
                "requests and duration_s are both set: set exactly one of them"
                if both
                else "requests is null and duration_s is not set: set exactly one of them "
                "(how many requests to measure, or for how many seconds)",
                {"field": "duration_s" if both else "requests"},
            )
        if self.duration_s is not None and self.duration_s > self.max_duration_s:
            # The load generator would refuse it at run time; a study file, at load time.
            raise PydanticCustomError(
                "duration",
                "duration_s ({duration}) exceeds max_duration_s ({limit}), the hard cap of "
                "the measure phase; raise max_duration_s too",
                {
                    "duration": f"{self.duration_s:g}",
                    "limit": f"{self.max_duration_s:g}",
                    "field": "duration_s",
                },
            )
        if self.dataset is not None:
            lengths = sorted({"input_len", "output_len"} & self.model_fields_set)
            if lengths:
                raise PydanticCustomError(
                    "dataset_lengths",
                    "{fields} and dataset exclude each other: lengths belong to the dataset "
                    "(dataset.input_len / output_len for kind random)",
                    {"fields": " and ".join(lengths), "field": lengths[0]},
                )
        if self.warmup_requests is None:
            self.warmup_requests = self.concurrency
        if self.prompt is None:
            self.prompt = "token_ids" if self.api == "completions" else "text"
        elif self.prompt == "token_ids" and self.api == "chat":
            raise PydanticCustomError(
                "prompt",
                "prompt 'token_ids' needs api 'completions' (chat takes text)",
                {"field": "prompt"},
            )
        return self

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, file: str | None = None) -> LoadSpec:
        """Validate user data, raising :class:`ConfigError` naming the file and field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(part) for part in err["loc"]) or (err.get("ctx") or {}).get(
                "field"
            )
            expected = (err.get("ctx") or {}).get("expected")
            raise ConfigError(
                err["msg"],
                file=file,
                field=field,
                allowed=[expected] if err["type"] == "literal_error" and expected else None,
            ) from None
