"""Outbox records as TypedDicts: a script's `emit({...})` fields checked against a type.

The engines' codecs declare one TypedDict per record type (groupbuy/locks/codec.py,
groupbuy/redpacket/codec.py); these helpers read a TypedDict's keys at run time, so a
parser and the tests that hold the scripts to the types share one definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar, cast

R = TypeVar("R")


def record_keys(shape: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(required, optional) keys of a TypedDict class."""
    return _keys(shape)[:2]


@cache
def _keys(shape: type) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(required, optional, either) keys of a TypedDict class, read once per class (the
    write-behind parses every record with them)."""
    required = frozenset(cast(Any, shape).__required_keys__)
    optional = frozenset(cast(Any, shape).__optional_keys__)
    return required, optional, required | optional


def record_fields(shape: Any, fields: Mapping[str, str]) -> dict[str, str]:
    """The fields of TypedDict `shape` out of `fields`: KeyError for a missing required
    one; fields the type does not have are left out (a newer script's, written during a
    rolling deploy, for a writer that does not know them yet)."""
    required, _optional, known = _keys(shape)
    if not required <= fields.keys():
        raise KeyError(min(required - fields.keys()))
    if fields.keys() <= known:
        # The common case, on the write-behind's path: the entry is the record as it is.
        return fields if isinstance(fields, dict) else dict(fields)
    return {key: value for key, value in fields.items() if key in known}


def parse_record(engine: str, shapes: Mapping[str, type[R]], fields: Mapping[str, str]) -> R:
    """An outbox entry's fields as the record type its `type` field names among `shapes`:
    ValueError for an unknown type, KeyError for a missing field (see `record_fields`)."""
    shape = shapes.get(fields.get("type", ""))
    if shape is None:
        raise ValueError(f"unknown {engine} record type {fields.get('type')!r}")
    return cast(R, record_fields(shape, fields))
