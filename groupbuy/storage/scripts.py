"""The Lua scripts registry: read lua/*.lua once, SCRIPT LOAD at start, EVALSHA afterwards.

redis-py's Script objects run EVALSHA and, on NOSCRIPT (after SCRIPT FLUSH or a
Redis restart), load the source again and retry, so callers never see it. Scripts that
are rarely called stay unloaded after such a loss until `reload_missing` (the readiness
check) loads them again.

Every script's first line is a shebang declaring its flags (`#!lua` for a write Redis
refuses up front when over maxmemory, `#!lua flags=allow-oom` or `flags=no-writes`): Redis
reads them only on the very first line of the source, so the libraries a script requires
go after it. (fakeredis does not know the shebang; groupbuy/storage/fake_adapter.py drops
it there, as Redis does, so every client is sent the same source.)

On a Redis Cluster every primary needs every script (a call runs on the primary of its
keys' slot): `load`, `loaded` and `reload_missing` ask every primary, and a NOSCRIPT from
one primary (after a failover or a resharding brought a node that never saw the script)
loads the script on every primary and sends the call again.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis.exceptions

from groupbuy.storage.pipelining import (
    MAX_RELOADS,
    AutoPipeline,
    ClusterAutoPipeline,
    ReplicaWait,
)
from groupbuy.storage.redis_client import every_primary

_REQUIRES = re.compile(r"^-- requires: (\S+)$", re.MULTILINE)
SHEBANG = "#!lua"
# Scripts that may write but whose writes a failover may lose without breaking anything a
# client was told, so they never wait for replicas: rate-limit counters (a lost count lets
# a few more requests through; a lost count of failed authentications, a few more guesses),
# the scheduler's lease (another process takes it over; the
# jobs are idempotent), the write probe (it writes nothing; it only lacks the flag so
# that Redis checks memory first) and the write-behind's acknowledgement (a lost one brings
# back records SQL already holds, which apply again as no-ops).
UNREPLICATED = frozenset(
    {
        "ratelimit_take",
        "guess_count",
        "lease_hold",
        "lease_release",
        "write_probe",
        "outbox_ack",
    }
)


def lua_dir() -> Path:
    """Where the .lua files are: inside the installed package, or lua/ of a source checkout."""
    packaged = Path(str(resources.files("groupbuy") / "lua"))
    if packaged.is_dir():
        return packaged
    return Path(str(resources.files("groupbuy"))).resolve().parent / "lua"


@cache
def script_source(name: str, flags: bool = True) -> str:
    """The full source of a script: its shebang line (unless `flags` is false: the Lua alone,
    as the scripts' own tests read it), its required libraries, then the rest of the script."""
    directory = lua_dir()
    shebang, _newline, body = (
        (directory / f"{name}.lua").read_text(encoding="utf-8").partition("\n")
    )
    if not shebang.startswith(SHEBANG):
        raise ValueError(f"lua/{name}.lua must start with a '{SHEBANG}' line declaring its flags")
    libs = [
        (directory / f"{lib}.lua").read_text(encoding="utf-8") for lib in _REQUIRES.findall(body)
    ]
    return "\n".join([shebang, *libs, body] if flags else [*libs, body])


def script_flags(name: str) -> frozenset[str]:
    """The flags a script's shebang declares (none for `#!lua`: it may write)."""
    shebang = script_source(name).partition("\n")[0]
    _lua, _sep, declared = shebang.partition("flags=")
    return frozenset(flag for flag in declared.strip().split(",") if flag)


def waits_for_replicas(name: str) -> bool:
    """Whether a call of this script waits for the replicas under `[redis] wait_replicas`:
    every script that may write (no `no-writes` flag), but those in UNREPLICATED."""
    return "no-writes" not in script_flags(name) and name not in UNREPLICATED


def script_names() -> list[str]:
    """Every runnable script (files starting with '_' are libraries)."""
    return sorted(p.stem for p in lua_dir().glob("*.lua") if not p.name.startswith("_"))


class Scripts:
    """Every script registered on one Redis client; calls go through `pipeline` when given
    (coalesced round trips), else one EVALSHA each. With `wait`, each call of a script that
    may write is followed by WAIT on the same connection before its answer is used."""

    def __init__(
        self,
        redis: Any,
        pipeline: AutoPipeline | ClusterAutoPipeline | None = None,
        wait: ReplicaWait | None = None,
    ) -> None:
        """Each script is sent with its shebang line; both call paths use these sources and
        shas. `wait`: the replicas to wait for (the pipeline, when given, must carry the
        same)."""
        self._redis = redis
        self._pipeline = pipeline
        self._wait = wait
        self._waited = frozenset(name for name in script_names() if waits_for_replicas(name))
        self._scripts = {
            name: redis.register_script(script_source(name)) for name in script_names()
        }

    @property
    def replica_wait(self) -> ReplicaWait | None:
        """What the calls that may write wait for (`[redis] wait_replicas`), or None."""
        return self._wait

    @property
    def pipeline(self) -> AutoPipeline | ClusterAutoPipeline | None:
        """The coalescing layer the calls go through, if any."""
        return self._pipeline

    def sha(self, name: str) -> str:
        """The SHA1 a script is called by."""
        return str(self._scripts[name].sha)

    def source(self, name: str) -> str:
        """The source this registry sends for a script (its shebang first)."""
        return str(self._scripts[name].script)

    async def load(self) -> None:
        """SCRIPT LOAD every script (on every primary of a cluster), so the first calls do not
        pay for it."""
        for script in self._scripts.values():
            await self._load(script.script)

    async def loaded(self) -> bool:
        """Whether Redis (every primary of a cluster) holds every script right now."""
        return all(await self._exist([script.sha for script in self._scripts.values()]))

    async def _load(self, source: str) -> None:
        await self._redis.execute_command("SCRIPT LOAD", source, **every_primary(self._redis))

    async def _exist(self, shas: list[str]) -> list[bool]:
        """Whether each script is there (on a cluster: on every primary, as redis-py folds
        the primaries' replies)."""
        reply = await self._redis.execute_command(
            "SCRIPT EXISTS", *shas, **every_primary(self._redis)
        )
        return [bool(there) for there in reply]

    async def reload_missing(self) -> list[str]:
        """SCRIPT LOAD the scripts Redis has forgotten (a restart, a failover, SCRIPT FLUSH);
        returns their names. The readiness check runs it, so readiness recovers by itself
        even for scripts no request has called since. On a cluster a script one primary lacks
        counts as missing (redis-py answers SCRIPT EXISTS sent to every primary with each
        sha present on all of them) and is loaded on every primary."""
        names = list(self._scripts)
        present = await self._exist([self._scripts[name].sha for name in names])
        missing = [name for name, there in zip(names, present, strict=True) if not there]
        for name in missing:
            await self._load(self._scripts[name].script)
        return missing

    async def call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Run a script by EVALSHA (loading it again if Redis forgot it); every script
        answers a table, `{code, ...}`."""
        script = self._scripts[name]
        wait = self._wait is not None and name in self._waited
        if self._pipeline is not None:
            reply: list[Any] = await self._pipeline.evalsha(
                script.sha, script.script, keys, args, wait=wait
            )
        elif wait:
            reply = await self._call_and_wait(script, keys, args)
        else:
            reply = await script(keys=keys, args=args)
        return reply

    async def _call_and_wait(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA then WAIT in one non-transactional pipeline: one connection, so the WAIT
        covers the script's writes (a resend after a dropped connection sends both again)."""
        assert self._wait is not None
        for _ in range(MAX_RELOADS + 1):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.execute_command(*self._wait.command())
                reply, acknowledged = await pipe.execute(raise_on_error=False)
            if isinstance(reply, redis.exceptions.NoScriptError):
                await self._redis.script_load(script.script)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acknowledged, Exception):
                raise acknowledged
            failure = self._wait.failure(int(acknowledged))
            if failure is not None:
                raise failure
            return reply
        raise redis.exceptions.NoScriptError(
            f"script missing again after loading it {MAX_RELOADS} times"
        )

    async def aclose(self) -> None:
        """Let the batches in flight finish (before the Redis client closes)."""
        if self._pipeline is not None:
            await self._pipeline.aclose()
