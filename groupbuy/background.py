"""The periodic work every process runs: write records to SQL, repair sends, expire packets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from groupbuy.app import Services

log = logging.getLogger(__name__)

Step = tuple[str, Callable[[], Awaitable[Any]]]


def maintenance_steps(services: Services) -> list[Step]:
    """What runs every interval, in order. Each step is idempotent: running it in several
    processes at once, or twice, changes nothing twice."""
    packets = services.packets
    return [
        ("team records", services.teams.record_pending),
        ("send repair", packets.repair_pending),
        ("packet expiry", packets.expire_due),
        ("packet records", packets.writer.drain_all),
    ]


async def run_periodically(steps: list[Step], interval_s: float, stop: asyncio.Event) -> None:
    """Run every step, then wait `interval_s`, until `stop` is set.

    Stopping is cooperative: cancelling a task inside an aiosqlite call can leave it
    waiting forever, so the loop only checks `stop` between rounds.
    """
    while not stop.is_set():
        for name, step in steps:
            try:
                await step()
            except Exception:
                log.warning("background step %r failed; retrying next round", name, exc_info=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
