"""LoadSpec / SLO validation rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autotune.errors import ConfigError
from autotune.loadgen import SLO, LoadSpec


def test_defaults() -> None:
    s = LoadSpec()
    assert (s.concurrency, s.input_len, s.output_len) == (16, 256, 32)
    assert s.warmup_requests == 16 and s.requests == 64 and s.duration_s is None
    assert s.max_duration_s == 120 and s.request_timeout_s == 60
    assert s.api == "completions" and s.prompt == "token_ids" and s.model is None
    assert s.temperature == 0 and s.ignore_eos is True
    assert s.slo == SLO() and s.slo.percentile == 99


def test_warmup_follows_concurrency_and_chat_uses_text() -> None:
    s = LoadSpec(concurrency=5, api="chat")
    assert s.warmup_requests == 5 and s.prompt == "text"
    assert LoadSpec(concurrency=5, warmup_requests=0).warmup_requests == 0


def test_duration_alone_clears_default_requests() -> None:
    s = LoadSpec(duration_s=30)
    assert s.requests is None and s.duration_s == 30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests": 10, "duration_s": 5}, "exactly one"),
        ({"requests": None}, "exactly one"),
        ({"duration_s": 200, "max_duration_s": 100}, "exceeds max_duration_s"),
        ({"api": "chat", "prompt": "token_ids"}, "needs api 'completions'"),
        ({"concurrency": 0}, "greater than or equal to 1"),
        ({"bogus": 1}, "Extra inputs"),
        ({"api": "grpc"}, "'completions' or 'chat'"),
    ],
)
def test_invalid_specs(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LoadSpec.model_validate(kwargs)


def test_from_mapping_raises_config_error_with_field() -> None:
    with pytest.raises(ConfigError) as info:
        LoadSpec.from_mapping({"api": "grpc"}, file="study.yaml")
    assert info.value.file == "study.yaml" and info.value.field == "api"
    assert "allowed" in str(info.value) and "study.yaml" in str(info.value)
    with pytest.raises(ConfigError, match="field 'slo.tpot_ms'"):
        LoadSpec.from_mapping({"slo": {"tpot_ms": -1}})


def test_slo_limits() -> None:
    assert SLO(tpot_ms=50, e2e_ms=900).limits() == {"tpot_ms": 50, "e2e_ms": 900}
    with pytest.raises(ValidationError):
        SLO(percentile=0)
