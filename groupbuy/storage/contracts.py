"""Script contracts: the one place that knows the order of a Lua script's KEYS and ARGV.

A `ScriptContract` names each KEYS[i] and ARGV[i] of one script, in order, with what it
means, and what the script answers. The scripts name the same slots in `local` lines at
their top (tests/lua/test_contracts.py checks both agree). Callers hand named key groups
(`KeyGroup` dataclasses built by groupbuy.storage.keys) and named arguments; the contract
turns them into the positional lists EVALSHA takes. docs/scripts.md is rendered from the
contracts (`python -m groupbuy.ops.script_docs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
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
        return {self.prefix + f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


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

    @property
    def key_names(self) -> tuple[str, ...]:
        """The KEYS names in order."""
        return tuple(slot.name for slot in self.keys)

    @property
    def arg_names(self) -> tuple[str, ...]:
        """The ARGV names in order."""
        return tuple(slot.name for slot in self.argv)

    def key_list(
        self,
        *groups: KeyGroup,
        more: Sequence[str] = (),
        **named: str,
    ) -> list[str]:
        """KEYS in this contract's order, from key groups (which may hold more keys than the
        script takes) and single named keys."""
        given: dict[str, str] = {}
        for group in groups:
            given.update(group.named())
        given.update(named)
        out: list[str] = []
        for name in self.key_names:
            if name in given:
                out.append(given[name])
            elif name not in self.optional_keys:
                raise TypeError(f"{self.name}: key {name!r} missing")
            else:
                break
        left = set(named) - set(self.key_names)
        if left:
            raise TypeError(f"{self.name}: unknown keys {sorted(left)}")
        if more and self.more_keys is None:
            raise TypeError(f"{self.name} takes no further keys")
        return [*out, *more]

    def arg_list(self, args: Mapping[str, Any], more: Sequence[Any] = ()) -> list[Any]:
        """ARGV in this contract's order, from named arguments and the variable tail."""
        names = self.arg_names
        if set(args) != set(names):
            raise TypeError(f"{self.name}: arguments {sorted(args)} are not {sorted(names)}")
        if more and self.more_argv is None:
            raise TypeError(f"{self.name} takes no further arguments")
        return [*(args[name] for name in names), *more]

    async def call(
        self,
        scripts: ScriptCaller,
        keys: list[str],
        args: Mapping[str, Any],
        more_args: Sequence[Any] = (),
    ) -> list[Any]:
        """Run the script with KEYS already in order (`key_list`) and named arguments."""
        return await scripts.call(self.name, keys, self.arg_list(args, more_args))


def slots(*pairs: tuple[str, str]) -> tuple[Slot, ...]:
    """Slots from (name, meaning) pairs."""
    return tuple(Slot(name, meaning) for name, meaning in pairs)
