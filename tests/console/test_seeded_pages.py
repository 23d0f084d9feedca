"""Every console page and listing on a seeded database (tests/support/console_seed.py, the
one the console benchmark times at full size): each SQL statement of a request returns at
most one page of rows (a page's rows, or one row per row of the page from a grouped read),
a request runs a handful of statements, and none sends KEYS/SCAN."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from starlette.testclient import TestClient

from groupbuy.console import feed
from tests.support.console import sign_in
from tests.support.console_seed import Scale, Seeded, pages, seed
from tests.support.http import ADMIN, ADMIN_KEY, app_services, portal

# More rows in every listed table than two pages hold (the whale has ~150 ledger entries).
SCALE = Scale(250, 600, 8, 3, 8, 3 * feed.PAGE, 250)
API_PAGE = 100  # the limit the benchmark's listing paths ask for
SLACK = 1  # a page reads one row more than it shows: whether a next page exists
STATEMENTS = 8  # a page's read, its grouped reads, reads by key (an activity, its rules)
SCANS = {"KEYS", "SCAN", "HSCAN", "SSCAN", "ZSCAN"}


class Reads:
    """Rows each SQL statement returned, and the Redis commands sent, since `reset`."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.commands: Counter[str] = Counter()

    def reset(self) -> None:
        self.rows.clear()
        self.commands.clear()

    def on_statement(self, _conn: Any, cursor: Any, *_args: Any) -> None:
        # The async adapters (aiosqlite, asyncpg) fetch a statement's rows when it runs.
        assert hasattr(cursor, "_rows"), type(cursor)
        self.rows.append(len(cursor._rows))


@pytest.fixture
def seeded(client: TestClient) -> Seeded:
    found: Seeded = portal(client).call(seed, app_services(client), SCALE)
    assert sign_in(client, ADMIN_KEY).status_code == 303
    return found


@pytest.fixture
def reads(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    import redis.asyncio.client as redis_client

    counted = Reads()
    for cls in (redis_client.Redis, redis_client.Pipeline):
        original = cls.execute_command

        def counting(self: Any, *args: Any, _original: Any = original, **kw: Any) -> Any:
            counted.commands[str(args[0]).upper()] += 1
            return _original(self, *args, **kw)

        monkeypatch.setattr(cls, "execute_command", counting)
    engine = app_services(client).database.engine.sync_engine
    event.listen(engine, "after_cursor_execute", counted.on_statement)
    try:
        yield counted
    finally:
        event.remove(engine, "after_cursor_execute", counted.on_statement)


def _bound(path: str) -> int:
    events = path.startswith(("/console/events", "/console/live.json?page=events"))
    return (feed.PAGE if events else API_PAGE) + SLACK


def test_every_page_reads_one_page_and_never_scans(
    client: TestClient, seeded: Seeded, reads: Reads
) -> None:
    measured = 0
    for path, cursor_key in pages(seeded):
        targets = [path]
        if cursor_key:  # the page after the first, by its cursor (when there is one)
            cursor = client.get(path, headers=ADMIN).json()[cursor_key]
            targets += [f"{path}&cursor={cursor}"] if cursor else []
        for target in targets:
            reads.reset()
            answer = client.get(target, headers=ADMIN)
            if answer.status_code == 404 and target.startswith("/console/"):
                continue  # a list page this version does not serve
            assert answer.status_code == 200, (target, answer.text[:300])
            assert max(reads.rows, default=0) <= _bound(target), (target, reads.rows)
            assert len(reads.rows) <= STATEMENTS, (target, reads.rows)
            assert not SCANS & set(reads.commands), (target, reads.commands)
            measured += 1
    assert measured >= 30
    # the seeding put more than a page in the listed tables
    assert len(client.get("/v1/redpackets?limit=100", headers=ADMIN).json()["packets"]) == 100


def test_every_activity_is_seeded_with_its_live_counts_in_redis(
    client: TestClient, seeded: Seeded
) -> None:
    """The pages are timed reading the counts hash, as once an activity has been listed."""
    services = app_services(client)
    assert len(seeded.counts_keys) == SCALE.activities

    async def present() -> list[bool]:
        return [bool(await services.redis.hexists(k, "counted")) for k in seeded.counts_keys]

    assert all(portal(client).call(present))
    # What the hash holds is SQL's count: the newest activity has a formed, a failed and
    # two open teams (their leaders are members, and the formed team's five).
    body = client.get(f"/v1/activities/{seeded.live_activity}", headers=ADMIN).json()
    assert (body["teams_open"], body["teams_formed"], body["teams_failed"]) == (2, 1, 1)
    assert body["members"] == 2 + 5
