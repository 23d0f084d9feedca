"""The overview's arithmetic (samples, rates, p99), its charts, and the integrity checks
read from a reconcile report."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from groupbuy.console import integrity
from groupbuy.console.charts import line_chart
from groupbuy.console.sampler import Sampler, quantile, rates_between, read_sample
from groupbuy.ops.reconcile.rules import KINDS
from tests.support.console import assert_no_inline_script


class _Metrics:
    """The metrics the sampler reads, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.http = Histogram(
            "groupbuy_http_request_duration_seconds",
            "",
            ["method", "route", "status"],
            buckets=(0.001, 0.01, 0.1, 1.0),
            registry=self.registry,
        )
        self.locks = Counter(
            "groupbuy_lock_outcomes_total", "", ["operation", "outcome"], registry=self.registry
        )
        self.grabs = Counter(
            "groupbuy_grab_outcomes_total", "", ["outcome"], registry=self.registry
        )
        self.backlog = Gauge(
            "groupbuy_writeback_backlog_records", "", ["engine"], registry=self.registry
        )


def test_a_sample_sums_requests_errors_locks_and_grabs() -> None:
    metrics = _Metrics()
    for status, seconds in (("200", 0.0005), ("201", 0.005), ("404", 0.05), ("503", 0.5)):
        metrics.http.labels("GET", "/r", status).observe(seconds)
    metrics.locks.labels("lock", "locked").inc(3)
    metrics.locks.labels("join", "locked").inc(2)
    metrics.locks.labels("lock", "team_full").inc(7)  # a refusal takes no seat
    metrics.grabs.labels("grabbed").inc(4)
    metrics.grabs.labels("sold_out").inc(9)
    metrics.backlog.labels("teams").set(12)
    sample = read_sample(metrics.registry.collect(), at=5.0)
    assert (sample.requests, sample.client_errors, sample.server_errors) == (4, 1, 1)
    assert (sample.locks, sample.grabs) == (5, 4)
    assert dict(sample.buckets) == {0.001: 1, 0.01: 2, 0.1: 3, 1.0: 4, float("inf"): 4}
    assert sample.gauges["groupbuy_writeback_backlog_records"] == {"teams": 12}


def test_the_p99_is_read_from_the_buckets_like_histogram_quantile() -> None:
    assert quantile(0.99, []) is None
    assert quantile(0.99, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    # 100 observations, 98 under 10 ms and 2 between 10 and 100 ms: rank 99 is the middle
    buckets = [(0.001, 0.0), (0.01, 98.0), (0.1, 100.0), (float("inf"), 100.0)]
    assert quantile(0.99, buckets) == 0.01 + (0.1 - 0.01) * 0.5
    # everything above the highest bound: the highest bound is the answer
    assert quantile(0.99, [(0.1, 0.0), (float("inf"), 5.0)]) == 0.1


def test_rates_are_per_second_between_two_samples() -> None:
    metrics = _Metrics()
    old = read_sample(metrics.registry.collect(), at=10.0)
    for _ in range(20):
        metrics.http.labels("POST", "/grab", "200").observe(0.005)
    metrics.grabs.labels("grabbed").inc(20)
    new = read_sample(metrics.registry.collect(), at=12.0)
    rates = rates_between(old, new)
    assert (rates.requests, rates.grabs, rates.locks) == (10.0, 10.0, 0.0)
    assert rates.p99_ms is not None and 1.0 < rates.p99_ms <= 10.0
    # counters that went back (a restarted worker) count as nothing, not negative
    assert rates_between(new, old).requests == 0.0


def test_the_sampler_keeps_one_sample_per_interval_in_a_ring() -> None:
    metrics = _Metrics()
    now = [0.0]
    sampler = Sampler(1.0, keep=3, read=metrics.registry.collect, clock=lambda: now[0])
    assert sampler.recent() is None  # one sample: no rate yet
    sampler.sample()
    assert len(sampler.series()) == 0
    for step in range(1, 6):
        now[0] = float(step)
        metrics.locks.labels("lock", "locked").inc(step)
        sampler.sample()
    series = sampler.series()
    assert len(series) == 2  # 3 samples kept: 2 intervals
    assert [rates.locks for _ago, rates in series] == [4.0, 5.0]
    assert series[-1][0] == 0.0
    recent = sampler.recent(window_s=10)
    assert recent is not None and recent.locks == 4.5


def test_a_chart_is_plain_svg_without_script_or_style() -> None:
    drawn = str(line_chart([(0, 1), (1, 3), (2, 2)], 'p99 <"latency">', " ms"))
    assert drawn.startswith('<svg class="chart"') and drawn.endswith("</svg>")
    assert "<polyline" in drawn and "max 3 ms" in drawn
    assert "&lt;&#34;latency&#34;&gt;" in drawn or "&lt;&quot;latency&quot;&gt;" in drawn
    assert_no_inline_script(drawn)
    assert "no samples yet" in str(line_chart([], "empty"))


def test_every_mismatch_kind_belongs_to_exactly_one_check() -> None:
    placed = [kind for kinds in integrity.CHECKS.values() for kind in kinds]
    assert sorted(placed) == sorted(KINDS)
    assert len(placed) == len(set(placed))


def _report(*kinds: str, count: int | None = None) -> dict[str, Any]:
    mismatches = [{"kind": kind, "packet_id": "p"} for kind in kinds]
    return {"mismatches": mismatches, "mismatch_count": len(kinds) if count is None else count}


def test_the_checks_turn_red_where_a_mismatch_lies() -> None:
    assert integrity.checks(None) == []
    green = integrity.checks(_report())
    assert [(c["name"], c["ok"]) for c in green] == [
        ("money conserved", True),
        ("seats within size", True),
        ("grabs recorded", True),
    ]
    red = {c["name"]: c for c in integrity.checks(_report("team_overfull"))}
    assert not red["seats within size"]["ok"]
    assert red["seats within size"]["mismatches"] == [{"kind": "team_overfull", "packet_id": "p"}]
    assert red["money conserved"]["ok"] and red["grabs recorded"]["ok"]
    # a kind no check knows, or mismatches counted past the listed ones: nothing is green
    assert not any(c["ok"] for c in integrity.checks(_report("new_kind")))
    assert not any(c["ok"] for c in integrity.checks(_report(count=5)))
