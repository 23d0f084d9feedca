"""JSON on the wire: answers rendered by orjson (the same bytes Starlette's JSONResponse
writes: compact, UTF-8, no NaN in our bodies, several times faster to produce), and the
checks on request bodies that the JSON parser does not make: the media type and
duplicate keys.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.responses import JSONResponse

JSON_MEDIA_TYPE = "application/json"


def is_json_media_type(content_type: str) -> bool:
    """Whether a Content-Type header names JSON: `application/json`, any case, with no
    parameter but a UTF-8 charset (RFC 8259: JSON between systems is UTF-8)."""
    media_type, _, parameters = content_type.partition(";")
    if media_type.strip().lower() != JSON_MEDIA_TYPE:
        return False
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        name = name.strip().lower()
        if name and (name != "charset" or value.strip().strip('"').lower() not in _UTF8):
            return False
    return True


_UTF8 = frozenset({"utf-8", "utf8"})


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def duplicate_key(raw: bytes) -> str | None:
    """The first key that appears twice in one object of the JSON text `raw`, at any depth
    (None when there is none, or when `raw` is not JSON: the validator says why)."""
    try:
        json.loads(raw, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as exc:
        return exc.key
    except (ValueError, RecursionError):
        return None
    return None


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _keys_in(value: Any) -> int:
    """How many object keys a parsed body holds: every key of a model (unknown keys are
    refused, so each key set a field), of a dict, at every depth."""
    if isinstance(value, BaseModel):
        fields = value.model_fields_set
        keys = len(fields)
        for name in fields:
            item = getattr(value, name)
            if type(item) not in _LEAVES:  # most fields: skip the checks below
                keys += _keys_in(item)
        return keys
    if isinstance(value, dict):
        return len(value) + sum(_keys_in(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_keys_in(item) for item in value)
    return 0


def may_have_duplicate_keys(raw: bytes, parsed: BaseModel) -> bool:
    """False when `raw` certainly has no key twice in one object, cheaply (no second parse).

    With no backslash in the text, a quote is always a string's edge, so each `":` ends a
    key; when every colon of the text is such a one, the text holds exactly that many
    keys. The parser keeps one value per key, so a duplicate leaves the parsed body with
    fewer keys than the text. Any other text (escapes, a colon inside a value, a space
    before a colon) goes to the full check, duplicate_key().
    """
    if b"\\" in raw:
        return True
    key_colons = raw.count(b'":')
    return key_colons != raw.count(b":") or key_colons != _keys_in(parsed)


class FastJSONResponse(JSONResponse):
    """A JSONResponse whose body is rendered by orjson."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
