"""The count of a console's live streams against their cap, and their end at shutdown."""

from __future__ import annotations

import weakref

_STREAMS: weakref.WeakSet[LiveStreams] = weakref.WeakSet()


class LiveStreams:
    """Counts this console's open streams against the cap and ends them on shutdown."""

    def __init__(self, cap: int, interval_s: float, lifetime_s: float) -> None:
        self.cap = cap
        self.interval_s = interval_s
        self.lifetime_s = lifetime_s
        self.open = 0
        self.stopping = False
        _STREAMS.add(self)

    def stop(self) -> None:
        """End every stream at its next update (they close within one interval)."""
        self.stopping = True


def stop_all() -> None:
    """End the streams of every console of this process (the server is shutting down)."""
    for streams in list(_STREAMS):
        streams.stop()
