"""A terminal table of :class:`Metrics` (rich), for ``autotune bench`` and progress output."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from autotune.loadgen.metrics import LatencyStats, Metrics

_LATENCIES = (
    ("TTFT", "ttft_ms"),
    ("TPOT", "tpot_ms"),
    ("ITL", "itl_ms"),
    ("E2E latency", "e2e_ms"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def metrics_table(metrics: Metrics) -> Table:
    """Throughputs and counts first, then latency mean/p50/p90/p99 in ms."""
    table = Table(title="Benchmark", show_lines=False)
    table.add_column("metric")
    table.add_column("value / mean", justify="right")
    table.add_column("p50", justify="right")
    table.add_column("p90", justify="right")
    table.add_column("p99", justify="right")

    rse = metrics.output_throughput_rse
    noise = "" if rse is None else f" (±{100 * rse:.1f}%)"
    scalars = [
        ("output throughput", f"{metrics.output_throughput:,.1f} tok/s{noise}"),
        ("total throughput", f"{metrics.total_throughput:,.1f} tok/s"),
        ("request throughput", f"{metrics.request_throughput:,.2f} req/s"),
        ("goodput", f"{metrics.goodput:,.2f} req/s ({metrics.slo_met} met SLOs)"),
        ("completed / failed", f"{metrics.completed} / {metrics.failed}"),
        ("error rate", f"{100 * metrics.error_rate:.1f}%"),
        ("duration", f"{metrics.duration_s:,.2f} s"),
        ("tokens in / out", f"{metrics.input_tokens:,} / {metrics.output_tokens:,}"),
    ]
    if metrics.usage_missing:
        scalars.append(("usage missing (chunks counted)", str(metrics.usage_missing)))
    if metrics.arrival_rate is not None:
        scalars.append(("offered rate (arrivals)", f"{metrics.arrival_rate:,.2f} req/s"))
    if metrics.client_cpu_share is not None:
        scalars.append(("client event loop busy", f"{100 * metrics.client_cpu_share:.0f}%"))
    if metrics.cpu_steal_share:
        scalars.append(("CPU taken by the hypervisor", f"{100 * metrics.cpu_steal_share:.1f}%"))
    for name, value in scalars:
        table.add_row(name, value, "", "", "")
    table.add_section()
    for label, field in _LATENCIES:
        stats: LatencyStats = getattr(metrics, field)
        table.add_row(
            f"{label} (ms)", _ms(stats.mean), _ms(stats.p50), _ms(stats.p90), _ms(stats.p99)
        )
    lag = metrics.send_lag_ms
    if lag is not None:
        table.add_row("send lag (ms)", _ms(lag.mean), _ms(lag.p50), _ms(lag.p90), _ms(lag.p99))
    if metrics.client_bound:
        table.add_section()
        table.add_row("[yellow]client-bound[/yellow]", Text(metrics.client_bound), "", "", "")
    if metrics.errors:
        table.add_section()
        for message, count in metrics.errors.items():
            table.add_row(f"[red]error x{count}[/red]", Text(message), "", "", "")
    return table
