"""The in-process fakeredis, adapted to answer as Redis 7 does where the service relies on it.

fakeredis is the tests' backend and the embedded engine's last fallback (no server binary
can run). Where it differs from Redis in a way the service's code would otherwise have to
know about, the difference is bridged here, once, so that no production module asks
whether its client is a fake:

- a script's first line may be a shebang (`#!lua flags=...`), which Redis reads and
  fakeredis would hand to Lua as code: it is dropped before Lua sees it, while the script
  keeps the SHA1 of its full source, as on Redis (the flags themselves are not enforced);
- XREADGROUP on a stream that does not exist answers Redis's NOGROUP error, where
  fakeredis answers the wording of XGROUP CREATE without MKSTREAM.

fakeredis and lupa are test dependencies (the `test` extra): this is the one module that
imports them, and groupbuy.storage.redis_client imports it only when the fallback is asked for.

It leans on fakeredis's command classes (`AsyncFakeSocket`, whose methods run the
commands, looked up by name); tests/storage/test_fake_adapter.py checks both bridges on
fakeredis and on a real server.
"""

from __future__ import annotations

import hashlib
from typing import Any

import fakeredis
import lupa  # noqa: F401  # fakeredis runs Lua through it, imported at the first EVAL only
from fakeredis import _msgs as fake_messages
from fakeredis._helpers import SimpleError
from fakeredis.aioredis import AsyncFakeSocket, FakeAsyncRedisConnection, FakeReader, FakeWriter

SHEBANG = b"#!"
# The server version fakeredis imitates (commands and their errors as in Redis 7.0).
VERSION = (7, 0)


class _RedisLikeSocket(AsyncFakeSocket):
    """fakeredis's command runner with the two differences above bridged."""

    def eval(self, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        if not script.startswith(SHEBANG):
            return super().eval(script, numkeys, *keys_and_args)
        # Cached under the full source's SHA1, as Redis does: EVALSHA finds it by that.
        self._server.script_cache[hashlib.sha1(script).hexdigest().encode()] = script
        # The newline stays, so Lua's line numbers match the file's.
        _shebang, newline, body = script.partition(b"\n")
        return super().eval(newline + body, numkeys, *keys_and_args)

    def xreadgroup(
        self, group_const: bytes, group_name: bytes, consumer_name: bytes, *args: bytes
    ) -> Any:
        try:
            return super().xreadgroup(group_const, group_name, consumer_name, *args)
        except SimpleError as error:
            if error.value != fake_messages.XGROUP_KEY_NOT_FOUND_MSG:
                raise
            missing = next(key for key in _streams(args) if self._db.get(key) is None)
            raise SimpleError(
                fake_messages.XREADGROUP_KEY_OR_GROUP_NOT_FOUND_MSG.format(
                    missing.decode(), group_name.decode()
                )
            ) from None


def _streams(args: tuple[bytes, ...]) -> list[bytes]:
    """The stream keys of XREADGROUP's arguments after the consumer: STREAMS k1 k2 id1 id2."""
    tail = list(args)
    names = [arg.upper() for arg in tail]
    after = tail[names.index(b"STREAMS") + 1 :]
    return after[: len(after) // 2]


class _RedisLikeConnection(FakeAsyncRedisConnection):
    """A fakeredis connection whose commands run on `_RedisLikeSocket` (fakeredis's own
    `_connect` with that class)."""

    async def _connect(self) -> None:
        if self._server is None or not self._server.connected:
            raise self._connection_error_class(fake_messages.CONNECTION_ERROR_MSG)
        self._sock = _RedisLikeSocket(
            self._server,
            self.db,
            client_class=self._client_class,
            lua_modules=self._lua_modules,
            client_info=self._client_info,
        )
        self._reader = FakeReader(self._sock)
        self._writer = FakeWriter(self._sock)


def fake_redis() -> Any:
    """An asyncio client on a fresh in-process fakeredis server (Lua via lupa), answering
    as Redis 7 where the service relies on it."""
    client = fakeredis.FakeAsyncRedis(
        server=fakeredis.FakeServer(version=VERSION),
        decode_responses=True,
        connection_class=_RedisLikeConnection,
    )
    return client
