"""The body of a delivery, rendered once per event and pass: every endpoint that gets the
event in one pass sends the same bytes (the signature, keyed per endpoint, is not shared).

`{"type", "timestamp", "data": <the feed event: id, type, at, data>}`, compact, UTF-8:
the envelope rendered by orjson, the event's data as the feed stored it (compact JSON).
"""

from __future__ import annotations

from datetime import datetime

import orjson
from groupbuy_client.wire import iso_ms, to_ms

# How the envelope's rendering ends: the inner "data" (the last key of both objects) is
# null, then the two objects close.
_DATA_END = b"null}}"


def message(position: int, event_type: str, at_ms: int, data: str) -> bytes:
    """The body of a delivery of the feed event at `position`, whose stored `data` is JSON
    text: spliced in as it is, not parsed and rendered again (that was half of a claim's
    time on the event loop)."""
    at = iso_ms(at_ms)
    envelope = {
        "type": event_type,
        "timestamp": at,
        "data": {"id": position, "type": event_type, "at": at, "data": None},
    }
    rendered = orjson.dumps(envelope)
    return rendered[: -len(_DATA_END)] + data.encode() + b"}}"


class Bodies:
    """Bodies of the events one pass claims, each rendered once however many endpoints
    get it."""

    def __init__(self) -> None:
        self._rendered: dict[int, bytes] = {}

    def body(self, position: int, event_type: str, at: datetime, data: str) -> bytes:
        """The body of the event at `position`, whose stored `data` is JSON text."""
        found = self._rendered.get(position)
        if found is None:
            found = message(position, event_type, to_ms(at), data)
            self._rendered[position] = found
        return found
