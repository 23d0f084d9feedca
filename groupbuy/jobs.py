"""The scheduled jobs: what time does, each idempotent and returning a report.

Every job can run in several processes at once or twice in a row and change nothing
twice: the scripts decide each transition once, and SQL writes are keyed by business
keys. The scheduler's lease only saves the duplicated work.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from groupbuy import metrics

if TYPE_CHECKING:
    from groupbuy.app import Services

Job = Callable[[], Awaitable[dict[str, Any]]]


def build_jobs(services: Services) -> dict[str, Job]:
    """Every job by name (the names of POST /v1/admin/jobs/{name}/run)."""
    teams, packets = services.teams, services.packets
    batch = services.settings.scheduler.sweep_batch

    async def sweep_locks() -> dict[str, Any]:
        return await teams.sweep("lock_due", batch)

    async def expire_teams() -> dict[str, Any]:
        return await teams.sweep("deadlines", batch)

    async def expire_packets() -> dict[str, Any]:
        return await packets.expire_due()

    async def flush_records() -> dict[str, Any]:
        team_records = await teams.record_pending()
        packet_records = await packets.writer.drain_all()
        writeback = await metrics.update_writeback(services)  # also sets the gauges
        return {
            "team_records": team_records,
            "packet_records": packet_records,
            "backlog": writeback["backlog_records"],
            "lag_s": writeback["lag_seconds"],
        }

    async def repair() -> dict[str, Any]:
        return {
            **await packets.repair_pending(),
            **await teams.release_ended(),
            **await packets.release_ended(),
        }

    async def reconcile() -> dict[str, Any]:
        return await services.reconciler.run()

    return {
        "sweep_locks": sweep_locks,
        "expire_teams": expire_teams,
        "expire_packets": expire_packets,
        "flush_records": flush_records,
        "repair": repair,
        "reconcile": reconcile,
    }
