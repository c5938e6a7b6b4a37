"""The rich table shows every headline figure."""

from __future__ import annotations

from rich.console import Console

import autotune.loadgen as loadgen
from autotune.loadgen import RequestRecord, compute_metrics
from autotune.loadgen.display import metrics_table


def render(table: object) -> str:
    console = Console(record=True, width=140, color_system=None)
    console.print(table)
    return console.export_text()


def test_table_contents() -> None:
    records = [
        RequestRecord(
            index=0,
            send_time=0.0,
            end_time=1.0,
            chunk_times=[0.25, 0.5, 1.0],
            prompt_tokens=8,
            completion_tokens=5,
        ),
        RequestRecord(index=1, send_time=0.0, end_time=0.5, error="HTTP 503: overloaded"),
    ]
    text = render(metrics_table(compute_metrics(records)))
    assert "output throughput" in text and "5.0 tok/s" in text
    assert "1 / 1" in text and "50.0%" in text
    assert "TTFT (ms)" in text and "250.0" in text
    assert "TPOT (ms)" in text and "187.5" in text
    assert "HTTP 503: overloaded" in text


def test_public_api_is_importable() -> None:
    for name in loadgen.__all__:
        assert getattr(loadgen, name) is not None
