"""The count of a console's live streams against their caps (all of them, and those of one
session), and their end at shutdown."""

from __future__ import annotations

import weakref

_STREAMS: weakref.WeakSet[LiveStreams] = weakref.WeakSet()


class LiveStreams:
    """Counts this console's open streams against the cap and ends them on shutdown."""

    def __init__(
        self, cap: int, interval_s: float, lifetime_s: float, per_session: int = 4
    ) -> None:
        self.cap = cap
        self.per_session = per_session
        self.interval_s = interval_s
        self.lifetime_s = lifetime_s
        self.open = 0
        self.by_session: dict[str, int] = {}
        self.stopping = False
        _STREAMS.add(self)

    def take(self, session: str) -> None:
        """Count a stream of `session` as open."""
        self.open += 1
        self.by_session[session] = self.by_session.get(session, 0) + 1

    def give_back(self, session: str) -> None:
        """Count a stream of `session` as ended."""
        self.open -= 1
        left = self.by_session.get(session, 0) - 1
        if left > 0:
            self.by_session[session] = left
        else:
            self.by_session.pop(session, None)

    def stop(self) -> None:
        """End every stream at its next update (they close within one interval)."""
        self.stopping = True


def stop_all() -> None:
    """End the streams of every console of this process (the server is shutting down)."""
    for streams in list(_STREAMS):
        streams.stop()
