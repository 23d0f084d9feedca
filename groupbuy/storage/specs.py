"""Script contracts: the one place that knows the order of a Lua script's KEYS and ARGV.

A `ScriptContract` names each KEYS[i] and ARGV[i] of one script, in order, with what it
means, and what the script answers. The scripts name the same slots in `local` lines at
their top (tests/lua/test_contracts.py checks both agree). Callers hand named key groups
(`KeyGroup` dataclasses built by groupbuy.storage.keys) and named arguments; the contract
turns them into the positional lists EVALSHA takes. docs/scripts.md is rendered from the
contracts (`python -m groupbuy.ops.script_docs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, Protocol


class ScriptCaller(Protocol):
    """What runs a script by name (groupbuy.storage.scripts.Scripts)."""

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
    the contracts (and in the scripts' `local` lines)."""

    prefix: ClassVar[str] = ""

    def named(self) -> dict[str, str]:
        """The keys by their contract names."""
        return {name: getattr(self, field) for name, field in self.contract_names()}

    @classmethod
    def contract_names(cls) -> tuple[tuple[str, str], ...]:
        """(contract name, field name) of each key of this group."""
        return tuple((cls.prefix + f.name, f.name) for f in fields(cls))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ScriptContract:
    """The KEYS and ARGV of one script, in order, and the shape of its reply.

    `optional_keys`: trailing keys a call may leave out. `more_keys` / `more_argv`: the
    variable-length tail after the named entries (the script names where it starts with a
    `local <name>_at = <i>` line)."""

    name: str
    summary: str
    keys: tuple[Slot, ...]
    argv: tuple[Slot, ...]
    reply: str
    optional_keys: tuple[str, ...] = ()
    more_keys: Slot | None = None
    more_argv: Slot | None = None

    # Worked out once per contract (a frozen dataclass still lets cached_property store its
    # value): every script call reads them.
    @cached_property
    def key_names(self) -> tuple[str, ...]:
        """The KEYS names in order."""
        return tuple(slot.name for slot in self.keys)

    @cached_property
    def arg_names(self) -> tuple[str, ...]:
        """The ARGV names in order."""
        return tuple(slot.name for slot in self.argv)

    @cached_property
    def _key_set(self) -> frozenset[str]:
        return frozenset(self.key_names)

    @cached_property
    def _arg_set(self) -> frozenset[str]:
        return frozenset(self.arg_names)

    def key_list(
        self,
        *groups: KeyGroup,
        more: Sequence[str] = (),
        **named: str,
    ) -> list[str]:
        """KEYS in this contract's order, from key groups (which may hold more keys than the
        script takes) and single named keys."""
        if more and self.more_keys is None:
            raise TypeError(f"{self.name} takes no further keys")
        # Where each key comes from depends only on the kinds of group and the names given,
        # so it is worked out once per call shape: this runs on every script call.
        shape = (*map(type, groups), *named)
        build = self._plans.get(shape)
        if build is None:
            build = self._plans[shape] = _builder(self._plan(groups, named))
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
        """ARGV in this contract's order, from named arguments and the variable tail."""
        names = self.arg_names
        if args.keys() != self._arg_set:
            raise TypeError(f"{self.name}: arguments {sorted(args)} are not {sorted(names)}")
        if more and self.more_argv is None:
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
