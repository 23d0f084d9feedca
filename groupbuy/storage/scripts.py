"""The Lua scripts registry: read lua/*.lua once, SCRIPT LOAD at start, EVALSHA afterwards.

redis-py's Script objects run EVALSHA and, on NOSCRIPT (after SCRIPT FLUSH or a
Redis restart), load the source again and retry, so callers never see it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from groupbuy.storage.pipelining import AutoPipeline

_REQUIRES = re.compile(r"^-- requires: (\S+)$", re.MULTILINE)


def lua_dir() -> Path:
    """Where the .lua files are: inside the installed package, or lua/ of a source checkout."""
    packaged = Path(str(resources.files("groupbuy") / "lua"))
    if packaged.is_dir():
        return packaged
    return Path(str(resources.files("groupbuy"))).resolve().parent / "lua"


@cache
def script_source(name: str) -> str:
    """The full source of a script: its required libraries first, then the script itself."""
    directory = lua_dir()
    body = (directory / f"{name}.lua").read_text(encoding="utf-8")
    libs = [
        (directory / f"{lib}.lua").read_text(encoding="utf-8") for lib in _REQUIRES.findall(body)
    ]
    return "\n".join([*libs, body])


def script_names() -> list[str]:
    """Every runnable script (files starting with '_' are libraries)."""
    return sorted(p.stem for p in lua_dir().glob("*.lua") if not p.name.startswith("_"))


class Scripts:
    """Every script registered on one Redis client; calls go through `pipeline` when given
    (coalesced round trips), else one EVALSHA each."""

    def __init__(self, redis: Any, pipeline: AutoPipeline | None = None) -> None:
        self._redis = redis
        self._pipeline = pipeline
        self._scripts = {
            name: redis.register_script(script_source(name)) for name in script_names()
        }

    async def load(self) -> None:
        """SCRIPT LOAD every script, so the first calls do not pay for it."""
        for script in self._scripts.values():
            await self._redis.script_load(script.script)

    async def loaded(self) -> bool:
        """Whether Redis holds every script right now (a readiness check)."""
        shas = [script.sha for script in self._scripts.values()]
        return all(await self._redis.script_exists(*shas))

    async def call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Run a script by EVALSHA (loading it again if Redis forgot it); every script
        answers a table, `{code, ...}`."""
        script = self._scripts[name]
        if self._pipeline is not None:
            reply: list[Any] = await self._pipeline.evalsha(script.sha, script.script, keys, args)
        else:
            reply = await script(keys=keys, args=args)
        return reply

    async def aclose(self) -> None:
        """Let the batches in flight finish (before the Redis client closes)."""
        if self._pipeline is not None:
            await self._pipeline.aclose()


def reply_dict(flat: list[Any]) -> dict[str, str]:
    """A flat `[field, value, field, value, ...]` part of a script reply (an HGETALL inside
    the script) as a dict."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))


def optional_int(value: Any) -> int | None:
    """An integer a script may leave out: scripts answer '' (or nothing) for none."""
    return int(value) if value not in (None, "") else None
