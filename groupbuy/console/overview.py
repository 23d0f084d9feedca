"""The overview's numbers: traffic from the sampled metrics, Redis and SQL health, the
write-behind backlog, dead letters, the scheduler's lease and each webhook endpoint's lag.

One snapshot serves every reader for `interval_s` (a live stream per operator costs one
set of reads a second per process, not one per stream).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select

from groupbuy.console.sampler import OUTCOME_STATUSES, Rates, Sample, Sampler
from groupbuy.ops.scheduler import LEASE
from groupbuy.services import Services
from groupbuy.storage.deadletters import DeadLetterRow

log = logging.getLogger(__name__)
_CHECK_WAIT_S = 1.0  # longest a health check holds up the overview


class Overview:
    """Builds the overview's numbers, at most once per interval for all readers."""

    def __init__(
        self,
        services: Services,
        sampler: Sampler,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._services = services
        self.sampler = sampler
        self._interval_s = interval_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    async def numbers(self) -> dict[str, Any]:
        """The overview's numbers, fresh within the interval."""
        async with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < self._interval_s * 0.9:
                return self._cached[1]
            numbers = await self._measure()
            self._cached = (now, numbers)
            return numbers

    async def _measure(self) -> dict[str, Any]:
        sample = self.sampler.sample()
        rates = self.sampler.recent()
        redis, database, dead, webhooks, held = await asyncio.gather(
            self._check(self._services.redis.ping()),
            self._check(self._services.database.ping()),
            self._dead_letters(),
            self._webhook_lag(),
            self._lease_held(),
        )
        gauges = sample.gauges

        def gauge(name: str, label: str = "") -> float | None:
            return gauges.get(name, {}).get(label)

        # The gauge sums this serve's workers (multiprocess mode); the lease key says
        # whether anyone holds it at all.
        here = sum(gauges.get("groupbuy_scheduler_leader", {}).values()) >= 1
        leader = "this serve" if here else "another process" if held else "none"
        if held is None and not here:
            leader = "unknown"
        return {
            "requests_per_s": _round(rates.requests if rates else None),
            "locks_per_s": _round(rates.locks if rates else None),
            "grabs_per_s": _round(rates.grabs if rates else None),
            "outcomes_per_s": _round(rates.outcomes if rates else None),
            "client_errors_per_s": _round(rates.client_errors if rates else None),
            "server_errors_per_s": _round(rates.server_errors if rates else None),
            "p99_ms": rates.p99_ms if rates else None,
            "redis": redis,
            "database": database,
            "backlog_teams": _int(gauge("groupbuy_writeback_backlog_records", "teams")),
            "backlog_packets": _int(gauge("groupbuy_writeback_backlog_records", "packets")),
            "lag_teams_s": _round(gauge("groupbuy_writeback_lag_seconds", "teams")),
            "lag_packets_s": _round(gauge("groupbuy_writeback_lag_seconds", "packets")),
            "dead_letters": dead,
            "scheduler_leader": leader,
            "webhook_lag": webhooks,
            **by_code(sample, rates),
        }

    async def _check(self, call: Any) -> str:
        try:
            await asyncio.wait_for(call, _CHECK_WAIT_S)
            return "ok"
        except Exception as exc:  # a health check reports, it never raises
            return f"down: {type(exc).__name__}"

    async def _dead_letters(self) -> int | None:
        """Dead letters not replayed yet (a count: dead letters are few, each is a fault)."""
        query = select(func.count()).select_from(DeadLetterRow)
        query = query.where(DeadLetterRow.replayed_at.is_(None))
        try:
            async with self._services.database.sessions() as session:
                count: int | None = await asyncio.wait_for(session.scalar(query), _CHECK_WAIT_S)
                return int(count or 0)
        except Exception:
            return None

    async def _lease_held(self) -> bool | None:
        """Whether some process holds the scheduler lease (one GET); None when Redis is away."""
        try:
            key = self._services.keys.lease(LEASE)
            return await asyncio.wait_for(self._services.redis.get(key), _CHECK_WAIT_S) is not None
        except Exception:
            return None

    async def _webhook_lag(self) -> dict[str, dict[str, float]]:
        """Per endpoint: pending deliveries and the age of the oldest undelivered event."""
        try:
            measured = await asyncio.wait_for(self._services.webhooks.measure(), _CHECK_WAIT_S)
        except Exception:
            log.debug("could not measure the webhook lag", exc_info=True)
            return {}
        return {
            endpoint: {"pending": depth, "lag_s": round(lag_s, 1)}
            for endpoint, (depth, lag_s) in sorted(measured.items())
        }


TABLES = ("outcomes_by_code", "errors_by_code")
"""The overview's tables keyed by problem code (a live update carries them as `tables`)."""


def by_code(sample: Sample, rates: Rates | None) -> dict[str, dict[str, float]]:
    """Problems per second by code over the recent window: the expected outcomes of a sale
    (OUTCOME_STATUSES) apart from the errors (another 4xx, a 5xx). Every code answered since
    the processes started is listed (0 when idle, or before a second sample)."""
    tables: dict[str, dict[str, float]] = {name: {} for name in TABLES}
    recent = rates.problems if rates else {}
    for (status, code), _total in sample.problems:
        table = tables["outcomes_by_code" if status in OUTCOME_STATUSES else "errors_by_code"]
        per_s = recent.get((status, code), 0.0)
        table[code] = round(table.get(code, 0.0) + per_s, 2)
    return tables


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
