"""The webhook benchmark's receiver: a bare ASGI app (uvicorn, a process of its own).

`POST /fast` answers 204 at once and notes each delivery's lag (now minus the
`sent_at_ms` the benchmark put into the event's data); `GET /lags` returns the
lags in ms and the webhook-ids seen, `GET /count` how many distinct ones, `DELETE /lags`
forgets them; `GET /healthz` answers 200 once it runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

lags_ms: list[float] = []
seen: list[str] = []


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """The receiver."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path, method = scope["path"], scope["method"]
    answer, status = b"", 204
    if path == "/fast" and method == "POST":
        arrived_ms = time.time() * 1000
        sent = json.loads(body)["data"]["data"].get("sent_at_ms")
        if sent is not None:
            lags_ms.append(arrived_ms - float(sent))
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        seen.append(headers.get("webhook-id", ""))
    elif path == "/healthz":
        status = 200
    elif path == "/count":
        answer, status = json.dumps({"seen": len(set(seen))}).encode(), 200
    elif path == "/lags" and method == "GET":
        answer, status = json.dumps({"lags_ms": lags_ms, "seen": seen}).encode(), 200
    elif path == "/lags" and method == "DELETE":
        lags_ms.clear()
        seen.clear()
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": answer})
