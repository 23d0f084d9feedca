"""JSON answers rendered by orjson: the same bytes Starlette's JSONResponse writes
(compact, UTF-8, no NaN in our bodies), several times faster to produce."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class FastJSONResponse(JSONResponse):
    """A JSONResponse whose body is rendered by orjson."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
