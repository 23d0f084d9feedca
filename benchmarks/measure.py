"""The measuring code every benchmark level shares: latency meter, percentiles, result rows.

Engine scenarios (benchmarks/engine/) time each call with a Meter; the HTTP level
(benchmarks/http_level.py) reads wrk's percentiles. Both turn what they measured into
`result_row`s, the one shape benchmarks/run.py reports and compares.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

CONCURRENCY = 256  # operations in flight at once, unless a scenario says otherwise

Row = dict[str, Any]
"""One measured row: scenario, level, implementation, ops, ops/s, p50/p95/p99, correctness."""


class Meter:
    """Bounds concurrency with a semaphore and records each operation's latency."""

    def __init__(self, concurrency: int = CONCURRENCY) -> None:
        self.gate = asyncio.Semaphore(concurrency)
        self.latencies: list[float] = []
        self.by_label: dict[str, list[float]] = defaultdict(list)

    async def measure(self, operation: Callable[[], Awaitable[Any]], label: str = "") -> Any:
        """Run one operation when a slot is free; its latency excludes the wait for the slot."""
        async with self.gate:
            began = time.perf_counter()
            try:
                return await operation()
            finally:
                elapsed = time.perf_counter() - began
                self.latencies.append(elapsed)
                if label:
                    self.by_label[label].append(elapsed)

    def breakdown(self) -> dict[str, dict[str, Any]]:
        """Count, p50 and p99 (ms) of each labelled kind of operation."""
        result = {}
        for label, values in sorted(self.by_label.items()):
            ordered = sorted(values)
            result[label] = {
                "ops": len(ordered),
                "p50_ms": percentile(ordered, 0.5),
                "p99_ms": percentile(ordered, 0.99),
            }
        return result


def percentile(ordered: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of sorted seconds, in ms."""
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return round(ordered[index] * 1000, 3)


async def gather_limited(calls: list[Callable[[], Awaitable[Any]]], limit: int = 32) -> list[Any]:
    """Run set-up calls with at most `limit` in flight (not measured)."""
    meter = Meter(limit)  # one gate for all calls: a Meter per call would bound nothing
    return await asyncio.gather(*(meter.measure(c) for c in calls))


def result_row(
    scenario: str,
    level: str,
    implementation: str,
    ops: int,
    seconds: float,
    percentiles_ms: tuple[float | None, float | None, float | None],
    correct: dict[str, Any],
    note: str,
    latencies_ms: list[float] | None = None,
    seconds_digits: int = 4,
    **extra: Any,
) -> Row:
    """One result row in the shape benchmarks/run.py expects (extra keys allowed)."""
    p50, p95, p99 = percentiles_ms
    return {
        "scenario": scenario,
        "level": level,
        "implementation": implementation,
        "ops": ops,
        "seconds": round(seconds, seconds_digits),
        "ops_per_s": round(ops / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": p50,
        "p95_ms": p95,
        "p99_ms": p99,
        "correct": correct,
        "latencies_ms": latencies_ms or [],
        "note": note,
        **extra,
    }
