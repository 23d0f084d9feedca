"""The body of a delivery, rendered once per event and pass: every endpoint that gets the
event in one pass sends the same bytes (the signature, keyed per endpoint, is not shared).

`{"type", "timestamp", "data": <the feed event: id, type, at, data>}`, compact, UTF-8,
rendered by orjson (a number orjson cannot hold, an integer past 64 bits, falls back to
the standard library's encoder).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import orjson

from groupbuy.storage.timefmt import iso_ms, to_ms


def message(position: int, event_type: str, at_ms: int, data: Any) -> bytes:
    """The body of a delivery of the feed event at `position`."""
    at = iso_ms(at_ms)
    body = {
        "type": event_type,
        "timestamp": at,
        "data": {"id": position, "type": event_type, "at": at, "data": data},
    }
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


class Bodies:
    """Bodies of the events one pass claims, each rendered once however many endpoints
    get it."""

    def __init__(self) -> None:
        self._rendered: dict[int, bytes] = {}

    def body(self, position: int, event_type: str, at: datetime, data: str) -> bytes:
        """The body of the event at `position`, whose stored `data` is JSON text."""
        found = self._rendered.get(position)
        if found is None:
            found = message(position, event_type, to_ms(at), json.loads(data))
            self._rendered[position] = found
        return found
