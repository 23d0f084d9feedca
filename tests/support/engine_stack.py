"""The team engine on a fresh fakeredis server and SQLite file, on its own event loop, with
Redis's clock frozen: the harness of the property-based state machines in tests/locks/.

The scripts' time then moves only through `RedisClock.advance`, so whether a lock has
expired is decided by the drawn steps, never by how fast the machine running the test is.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar
from unittest import mock

import fakeredis._socket._base as fake_socket_base
import fakeredis.commands_mixins.server_mixin as fake_server_mixin

from groupbuy.services import Services, build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from tests.support.redis import make_async_redis
from tests.support.schema import database_with_schema

T = TypeVar("T")


class _FrozenTime:
    """Stands in for the `time` module inside fakeredis: a clock that moves only when told."""

    def __init__(self, start_s: float, shift_ms: Callable[[], int]) -> None:
        self._start_s = start_s
        self._shift_ms = shift_ms

    def time(self) -> float:
        return self._start_s + self._shift_ms() / 1000


@contextlib.contextmanager
def frozen_redis_clock(start_s: float, shift_ms: Callable[[], int]) -> Iterator[None]:
    """Freeze fakeredis's TIME at `start_s`, and let key expiry (PX) follow the scripts' time.

    The scripts read TIME and add RedisClock.shift_ms themselves; key TTLs are judged by
    the server's own clock, which here is start + shift, as it would be in production
    where scripts and key expiry share one clock.
    """
    with (
        mock.patch.object(fake_server_mixin, "time", _FrozenTime(start_s, lambda: 0)),
        mock.patch.object(fake_socket_base, "time", _FrozenTime(start_s, shift_ms)),
    ):
        yield


class EngineStack:
    """The team engine on a fresh fakeredis server and SQLite file, on its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._exit = contextlib.ExitStack()
        self._tmp = Path(tempfile.mkdtemp(prefix="groupbuy-props-"))
        self._exit.callback(shutil.rmtree, self._tmp, ignore_errors=True)
        self._exit.callback(self.loop.close)
        self.start_ms = int(time.time()) * 1000
        settings = load_settings(
            None,
            {
                "GROUPBUY_DATABASE_URL": database_with_schema(self._tmp),
                "GROUPBUY_REDIS_URL": "",
            },
        )
        self.redis = make_async_redis("")
        self.database = Database(settings.database.effective_url)
        self.services: Services = build_services(settings, redis=self.redis, database=self.database)
        clock = self.services.clock
        self._exit.enter_context(frozen_redis_clock(self.start_ms / 1000, lambda: clock.shift_ms))
        self._exit.callback(lambda: self.run(self.redis.aclose()))
        self._exit.callback(lambda: self.run(self.database.dispose()))
        self.run(self.services.scripts.load())

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self._exit.close()
