"""What every console handler is given: the services, the sign-in gate, the overview and
the live streams of this console."""

from __future__ import annotations

from dataclasses import dataclass

from groupbuy.console.identity import Gate
from groupbuy.console.overview import Overview
from groupbuy.console.streams import LiveStreams
from groupbuy.services import Services


@dataclass(frozen=True)
class Context:
    """The console's parts, built once per app."""

    services: Services
    gate: Gate
    overview: Overview
    live: LiveStreams
