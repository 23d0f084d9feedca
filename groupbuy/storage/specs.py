"""The Lua scripts: each one's spec (the one place that knows its KEYS, ARGV and replies),
the one reply parser, and the registry that loads and runs them.

A `ScriptSpec` names each KEYS[i] and ARGV[i] of one script, in order, with what it means,
and, for each code the script answers, the named fields after the code. The scripts name
the same slots in `local` lines at their top (tests/lua/test_contracts.py checks both
agree). Callers hand named key groups (`KeyGroup` dataclasses built by
groupbuy.storage.keys) and named arguments; the spec turns them into the positional lists
EVALSHA takes, and `parse` (the one reply parser) reads the reply into a `Reply`: its code
and its fields by name. A script whose reply is one fixed shape without a code
(`{deleted, left}`) has a `reply` shape instead of `replies`; `parse` reads it the same
way, under the code `Fixed.REPLY`. docs/scripts.md is rendered from the specs
(`python -m scripts.script_docs`).

The registry: read lua/*.lua once, SCRIPT LOAD at start, EVALSHA afterwards.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum
from functools import cache, cached_property
from importlib import resources
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import redis.exceptions

from groupbuy.storage.pipelining import (
    MAX_RELOADS,
    AutoPipeline,
    ClusterAutoPipeline,
    ReplicaWait,
)
from groupbuy.storage.redis_client import every_primary

C = TypeVar("C", bound=IntEnum)


class ScriptCaller(Protocol):
    """What runs a script by name (Scripts, below)."""

    async def call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Run a script; its reply table."""
        ...


@dataclass(frozen=True)
class Slot:
    """One KEYS or ARGV entry: the name the Lua `local` line gives it, and its meaning."""

    name: str
    meaning: str


class KeyGroup:
    """A frozen dataclass of related keys; each field is named `prefix` + field name in
    the specs (and in the scripts' `local` lines)."""

    prefix: ClassVar[str] = ""

    def named(self) -> dict[str, str]:
        """The keys by their spec names."""
        return {name: getattr(self, field) for name, field in self.contract_names()}

    @classmethod
    def contract_names(cls) -> tuple[tuple[str, str], ...]:
        """(spec name, field name) of each key of this group."""
        return tuple((cls.prefix + f.name, f.name) for f in fields(cls))  # type: ignore[arg-type]


class Verdict(IntEnum):
    """The code of a script that answers `{1}` (yes: done, held, due) or `{0}` (no)."""

    NO = 0
    YES = 1


class Fixed(IntEnum):
    """The code a reply without one is read under: the one shape of its script."""

    REPLY = 0


class ReplyError(ValueError):
    """A reply off its script's spec (a code it does not list, fields more or fewer than
    the code's): a bug."""


def flag(value: Any) -> bool:
    """A script's 0 or 1."""
    return bool(int(value))


def optional_int(value: Any) -> int | None:
    """An integer a script may leave out: scripts answer '' (or nothing) for none."""
    return int(value) if value not in (None, "") else None


def reply_dict(flat: list[Any]) -> dict[str, str]:
    """A flat `[field, value, field, value, ...]` part of a script reply (an HGETALL inside
    the script) as a dict."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))


@dataclass(frozen=True)
class Field:
    """One named field of a reply after its code, and how to read it (`read`: int, str,
    flag, optional_int, ...). A `rest` field is the last: it reads every value left, as a
    list."""

    name: str
    read: Callable[[Any], Any] = str
    rest: bool = False


@dataclass(frozen=True)
class Shape:
    """What follows one reply code: its fields in order, and what the reply means.
    `given`: fields the caller knows and hands `parse` (a lock's team id), not in the
    reply."""

    meaning: str
    fields: tuple[Field, ...] = ()
    given: tuple[str, ...] = ()

    @cached_property
    def _reads(self) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
        return tuple((f.name, f.read) for f in self.fields if not f.rest)

    @cached_property
    def _rest(self) -> Field | None:
        return self.fields[-1] if self.fields and self.fields[-1].rest else None

    def read(self, script: str, code: IntEnum, values: Sequence[Any]) -> dict[str, Any]:
        """The fields by name from the values after the code."""
        reads, rest = self._reads, self._rest
        if len(values) != len(reads) and (rest is None or len(values) < len(reads)):
            raise ReplyError(
                f"{script} answered {code.name} with {list(values)!r}, not "
                f"{[f.name for f in self.fields]}"
            )
        if not reads and rest is not None:  # one field of every value: no copy, no loop
            return {rest.name: rest.read(values)}
        out = {name: read(value) for (name, read), value in zip(reads, values, strict=False)}
        if rest is not None:
            out[rest.name] = rest.read(values[len(reads) :])
        return out


def shape(
    meaning: str, *named: tuple[str, Callable[[Any], Any]] | Field, given: tuple[str, ...] = ()
) -> Shape:
    """A Shape from (name, read) pairs or Fields."""
    return Shape(meaning, tuple(f if isinstance(f, Field) else Field(*f) for f in named), given)


class Reply(Generic[C]):
    """A parsed reply: its code (the script's code enum) and its fields by name, read as
    attributes (`reply.locked_at_ms`); a field the code does not carry raises
    AttributeError.

    The fields are also the instance's attributes, so a read is an ordinary attribute
    lookup: the engines read several on every hot call, and `__getattr__` runs only for
    a field the code does not carry. No shape names a field `code`, `fields` or `get`."""

    def __init__(self, code: C, /, **fields: Any) -> None:
        self.__dict__.update(fields)
        self.code = code
        self.fields: Mapping[str, Any] = fields

    @classmethod
    def of(cls, code: C, fields: Mapping[str, Any]) -> Reply[C]:
        """A reply from its code and its fields already in a mapping."""
        made = cls.__new__(cls)
        made.__dict__.update(fields)
        made.code, made.fields = code, fields
        return made

    def get(self, name: str, default: Any = None) -> Any:
        """A field the code may not carry, or `default`."""
        return self.fields.get(name, default)

    def __getattr__(self, name: str) -> Any:
        # Only for a name that is no attribute: every field is one already.
        code = self.__dict__.get("code")
        raise AttributeError(f"a {getattr(code, 'name', code)} reply has no field {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Reply):
            return NotImplemented
        return bool(self.code is other.code and dict(self.fields) == dict(other.fields))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        named = ", ".join(f"{name}={value!r}" for name, value in self.fields.items())
        return f"Reply({self.code.name}{', ' if named else ''}{named})"


@dataclass(frozen=True)
class ScriptSpec(Generic[C]):
    """The KEYS and ARGV of one script, in order, and each reply code's fields.

    `replies`: each code's shape, for a reply `[code, field, ...]`; or `reply`: the one
    shape of a reply `[field, ...]` without a code (read under `Fixed.REPLY`).
    `optional_keys`: trailing keys a call may leave out. `more_keys` / `more_args`: the
    variable-length tail after the named entries (the script names where it starts with a
    `local <name>_at = <i>` line)."""

    name: str
    summary: str
    keys: tuple[Slot, ...]
    args: tuple[Slot, ...]
    replies: Mapping[C, Shape] = field(default_factory=dict)
    reply: Shape | None = None  # the one shape of a reply without a code, for no `replies`
    optional_keys: tuple[str, ...] = ()
    more_keys: Slot | None = None
    more_args: Slot | None = None

    def __post_init__(self) -> None:
        if (self.reply is None) == (not self.replies):
            raise TypeError(f"{self.name}: give either `replies` (by code) or one `reply`")

    # Worked out once per spec (a frozen dataclass still lets cached_property store its
    # value): every script call reads them.
    @cached_property
    def key_names(self) -> tuple[str, ...]:
        """The KEYS names in order."""
        return tuple(slot.name for slot in self.keys)

    @cached_property
    def arg_names(self) -> tuple[str, ...]:
        """The ARGV names in order."""
        return tuple(slot.name for slot in self.args)

    @cached_property
    def _key_set(self) -> frozenset[str]:
        return frozenset(self.key_names)

    @cached_property
    def _arg_set(self) -> frozenset[str]:
        return frozenset(self.arg_names)

    @cached_property
    def _by_number(self) -> dict[int, tuple[C, Shape]]:
        return {int(code): (code, answer) for code, answer in self.replies.items()}

    def parse(self, raw: Sequence[Any], **known: Any) -> Reply[C]:
        """The reply `[code, field, ...]` (or `[field, ...]` for a `reply` shape) read by
        this spec; `known`: the fields the caller knows (a shape takes those it names
        `given`). A code the spec does not list, or fields more or fewer than its shape's,
        is a bug and raises ReplyError."""
        answer = self.reply
        if answer is not None:
            code: Any = Fixed.REPLY
            values = answer.read(self.name, code, raw)
        else:
            if not raw:
                raise ReplyError(f"{self.name} answered {raw!r}, without a code")
            found = self._by_number.get(int(raw[0]))
            if found is None:
                raise ReplyError(
                    f"{self.name} answered code {raw[0]!r}, which its spec does not list"
                )
            code, answer = found
            values = answer.read(self.name, code, raw[1:])
        for name in answer.given:
            values[name] = known[name]
        return Reply.of(code, values)

    def key_list(
        self,
        *groups: KeyGroup,
        more: Sequence[str] = (),
        **named: str,
    ) -> list[str]:
        """KEYS in this spec's order, from key groups (which may hold more keys than the
        script takes) and single named keys."""
        if more and self.more_keys is None:
            raise TypeError(f"{self.name} takes no further keys")
        # Where each key comes from depends only on the kinds of group and the names given,
        # so it is worked out once per call shape: this runs on every script call.
        call_shape = (*map(type, groups), *named)
        build = self._plans.get(call_shape)
        if build is None:
            build = self._plans[call_shape] = _builder(self._plan(groups, named))
        out = build(groups, named)
        out.extend(more)
        return out

    @cached_property
    def _plans(self) -> dict[tuple[Any, ...], KeyListBuilder]:
        return {}

    def _plan(
        self, groups: Sequence[KeyGroup], named: Mapping[str, str]
    ) -> tuple[tuple[int, str], ...]:
        """(group index or -1 for a named key, field or name) of each KEYS entry."""
        sources: dict[str, tuple[int, str]] = {}
        for at, group in enumerate(groups):
            sources.update((name, (at, field)) for name, field in group.contract_names())
        sources.update((name, (-1, name)) for name in named)
        if not self._key_set.issuperset(named):
            raise TypeError(f"{self.name}: unknown keys {sorted(set(named) - self._key_set)}")
        plan: list[tuple[int, str]] = []
        for name in self.key_names:
            if name in sources:
                plan.append(sources[name])
            elif name not in self.optional_keys:
                raise TypeError(f"{self.name}: key {name!r} missing")
            else:
                break
        return tuple(plan)

    def arg_list(self, args: Mapping[str, Any], more: Sequence[Any] = ()) -> list[Any]:
        """ARGV in this spec's order, from named arguments and the variable tail."""
        names = self.arg_names
        if args.keys() != self._arg_set:
            raise TypeError(f"{self.name}: arguments {sorted(args)} are not {sorted(names)}")
        if more and self.more_args is None:
            raise TypeError(f"{self.name} takes no further arguments")
        out = [args[name] for name in names]
        out.extend(more)
        return out

    async def call(
        self,
        scripts: ScriptCaller,
        keys: list[str],
        args: Mapping[str, Any],
        more_args: Sequence[Any] = (),
    ) -> list[Any]:
        """Run the script with KEYS already in order (`key_list`) and named arguments."""
        return await scripts.call(self.name, keys, self.arg_list(args, more_args))

    async def run(
        self,
        scripts: ScriptCaller,
        keys: list[str],
        args: Mapping[str, Any],
        more_args: Sequence[Any] = (),
        **known: Any,
    ) -> Reply[C]:
        """Run the script with KEYS already in order (`key_list`) and named arguments; its
        reply parsed."""
        return self.parse(await self.call(scripts, keys, args, more_args), **known)


KeyListBuilder = Callable[[Sequence[KeyGroup], Mapping[str, str]], list[str]]


def _builder(plan: Sequence[tuple[int, str]]) -> KeyListBuilder:
    """A function that lays out KEYS by `plan`: each run of keys from one source (a group,
    or the named keys) is read by one attrgetter or itemgetter call, so a script call
    pays a few C calls rather than a Python step per key."""
    runs: list[tuple[int, list[str]]] = []
    for at, source in plan:
        if runs and runs[-1][0] == at:
            runs[-1][1].append(source)
        else:
            runs.append((at, [source]))
    getters: list[tuple[int, Callable[[Any], Any], bool]] = [
        (at, (attrgetter if at >= 0 else itemgetter)(*names), len(names) == 1) for at, names in runs
    ]

    def build(groups: Sequence[KeyGroup], named: Mapping[str, str]) -> list[str]:
        out: list[str] = []
        for at, get, single in getters:
            got = get(groups[at] if at >= 0 else named)
            if single:
                out.append(got)
            else:
                out.extend(got)
        return out

    return build


def slots(*pairs: tuple[str, str]) -> tuple[Slot, ...]:
    """Slots from (name, meaning) pairs."""
    return tuple(Slot(name, meaning) for name, meaning in pairs)


# -- the registry: load the scripts, run them by name ------------------------------

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
