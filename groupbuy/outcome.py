"""What a creating service call returns: the body, and whether this call created it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """A create's answer: 201 when this call created it, 200 when it found the same thing."""

    body: Mapping[str, Any]
    created: bool
