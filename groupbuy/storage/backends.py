"""What every service talks to, handed over as one object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from groupbuy.storage.clock import RedisClock
from groupbuy.storage.db import Database
from groupbuy.storage.keys import Keys
from groupbuy.storage.slots import SlotDirectory
from groupbuy.storage.specs import Scripts


@dataclass(frozen=True)
class Backends:
    """Redis (the live state) with its scripts and key names, SQL (the record), the clock."""

    redis: Any
    scripts: Scripts
    database: Database
    keys: Keys
    clock: RedisClock


class UsesBackends:
    """Base of the services: keeps the backends as the attributes the services use."""

    def __init__(self, backends: Backends) -> None:
        self._redis = backends.redis
        self._scripts = backends.scripts
        self._db = backends.database
        self._keys = backends.keys
        self._clock = backends.clock
        self._slots = SlotDirectory(backends.redis, backends.keys)
