"""The audit log keeps each action with its actor and reason, and pages newest first."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from groupbuy.ops.audit import REASON_CHARS, AuditLog
from groupbuy.storage.db import Database


@pytest.fixture
async def audit(database_url: str) -> AsyncIterator[AuditLog]:
    database = Database(database_url)
    try:
        yield AuditLog(database, clock=lambda: 1_800_000_000.25)
    finally:
        await database.dispose()


async def test_an_action_is_kept_with_who_what_why_and_when(audit: AuditLog) -> None:
    written = await audit.record(
        "admin:3f2a", "activity.close", "a1", "sold out early", {"status": "closed"}
    )

    page = await audit.page(10)

    assert page["entries"] == [written]
    assert written["actor"] == "admin:3f2a"
    assert written["action"] == "activity.close"
    assert written["target"] == "a1"
    assert written["reason"] == "sold out early"
    assert written["detail"] == {"status": "closed"}
    assert written["at"] == "2027-01-15T08:00:00.250Z"
    assert page["next_cursor"] is None


async def test_pages_run_newest_first_and_end_with_no_cursor(audit: AuditLog) -> None:
    for n in range(5):
        await audit.record("admin:3f2a", "job.run", f"job{n}")

    first = await audit.page(2)
    second = await audit.page(2, first["next_cursor"])
    last = await audit.page(2, second["next_cursor"])

    targets = [e["target"] for p in (first, second, last) for e in p["entries"]]
    assert targets == ["job4", "job3", "job2", "job1", "job0"]
    assert last["next_cursor"] is None


async def test_a_long_reason_is_cut_and_an_empty_one_kept_as_none(audit: AuditLog) -> None:
    long = await audit.record("viewer:1", "user.block", "u1", "x" * (REASON_CHARS + 50))
    empty = await audit.record("viewer:1", "user.unblock", "u1", "")

    assert long["reason"] == "x" * REASON_CHARS
    assert empty["reason"] is None
