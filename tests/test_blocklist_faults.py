"""A block or unblock writes SQL and Redis: after a refusal or a fault in either, the two
still agree, and the action's audit row exists exactly when the change was committed. On
SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.services import Services


class Fault(Exception):
    """What the test makes fail."""


async def _state(services: Services, uid: str) -> tuple[Any, Any, list[Any]]:
    """The SQL record's reason (or None), Redis's copy (or None), and the audit entries."""
    listed = await services.blocklist.page(100)
    reasons = {u["user_id"]: u["reason"] or "" for u in listed["blocked_users"]}
    in_redis = await services.redis.hget(services.keys.blocked_users(), uid)
    audit = (await services.audit.page(100))["entries"]
    return reasons.get(uid), in_redis, [(e["action"], e["target"]) for e in audit]


def _commit_fails(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next transactions fail at their end: the change is rolled back, as when the
    commit itself fails (the connection lost at that moment)."""
    real: Callable[..., Any] = services.database.transaction

    @asynccontextmanager
    async def failing(urgent: bool = False) -> AsyncIterator[AsyncSession]:
        async with real(urgent) as session:
            yield session
            raise Fault("the commit failed")

    monkeypatch.setattr(services.database, "transaction", failing)


def _audit_row(services: Services, action: str, uid: str, reason: str | None = None) -> Any:
    return services.audit.entry("admin:0123456789abcdef", action, uid, reason)


async def test_a_block_and_its_audit_row_are_committed_together(services: Services) -> None:
    row = _audit_row(services, "user.block", "u1", "spam")
    await services.blocklist.block("u1", "spam", row)
    reason, in_redis, audit = await _state(services, "u1")
    assert reason == "spam" and in_redis.endswith("|spam")
    assert audit == [("user.block", "u1")]
    await services.blocklist.unblock("u1", _audit_row(services, "user.unblock", "u1"))
    assert await _state(services, "u1") == (None, None, [("user.unblock", "u1"), audit[0]])


async def test_a_block_whose_commit_fails_leaves_redis_as_sql(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    _commit_fails(services, monkeypatch)
    with pytest.raises(Fault):
        await services.blocklist.block("u1", "spam", _audit_row(services, "user.block", "u1"))
    assert await _state(services, "u1") == (None, None, [])


async def test_a_changed_reason_whose_commit_fails_keeps_the_old_one_in_both(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await services.blocklist.block("u1", "first")
    before = await _state(services, "u1")
    _commit_fails(services, monkeypatch)
    with pytest.raises(Fault):
        await services.blocklist.block("u1", "second", _audit_row(services, "user.block", "u1"))
    assert await _state(services, "u1") == before


async def test_an_unblock_whose_commit_fails_leaves_the_user_blocked_in_both(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await services.blocklist.block("u1", "spam")
    before = await _state(services, "u1")
    _commit_fails(services, monkeypatch)
    with pytest.raises(Fault):
        await services.blocklist.unblock("u1", _audit_row(services, "user.unblock", "u1"))
    assert await _state(services, "u1") == before


async def test_a_block_redis_refuses_is_not_recorded_in_sql(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused(*_args: Any) -> Any:
        raise Fault("Redis refused the write")

    monkeypatch.setattr(services.redis, "hset", refused)
    with pytest.raises(Fault):
        await services.blocklist.block("u1", "spam", _audit_row(services, "user.block", "u1"))
    monkeypatch.undo()
    assert await _state(services, "u1") == (None, None, [])


async def test_a_reason_sql_refuses_never_reaches_redis(services: Services) -> None:
    """Past the API's checks (a caller of the service itself): SQL's refusal comes before
    Redis is written. SQLite keeps any text, so the refusal is PostgreSQL's NUL."""
    row = _audit_row(services, "user.block", "u1", "spam\x00")
    if services.database.engine.dialect.name != "postgresql":
        pytest.skip("only PostgreSQL refuses a NUL in text")
    with pytest.raises(Exception):  # noqa: B017, PT011 (the driver's own error)
        await services.blocklist.block("u1", "spam\x00", row)
    assert await _state(services, "u1") == (None, None, [])
