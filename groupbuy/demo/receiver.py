"""The demo's webhook receiver: a stdlib HTTP server on 127.0.0.1 (a free port), in a
thread of its own, that verifies each delivery's Standard Webhooks signature with the
reference library (`standardwebhooks`, as the tests and docs/webhooks.md's receiver do)
and counts what it got."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook

from groupbuy.demo.tally import WebhookCounts

PATH = "/groupbuy-events"
MAX_BODY_BYTES = 1 << 20  # the service sends at most 64 KiB ([webhooks] max_payload_bytes)


class WebhookReceiver:
    """Counts the POSTs to PATH: verified with the endpoint's secret (each `webhook-id`
    once; a repeat is counted apart), or not (answered 400). Until the secret is known
    every POST answers 503, which the service retries."""

    def __init__(self, counts: WebhookCounts) -> None:
        self.counts = counts
        self._secret: str | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="demo-webhooks", daemon=True
        )

    @property
    def url(self) -> str:
        """Where the receiver listens."""
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}{PATH}"

    def use_secret(self, secret: str) -> None:
        """Verify from now on with `secret` (the `whsec_...` of the registration)."""
        self._secret = secret

    def received(self, body: bytes, headers: dict[str, str]) -> HTTPStatus:
        """Verify and count one delivery; the status to answer."""
        secret = self._secret
        if secret is None:
            return HTTPStatus.SERVICE_UNAVAILABLE
        try:
            message: Any = Webhook(secret).verify(body, headers)
        except Exception:  # WebhookVerificationError, or a header too mangled to parse
            with self._lock:
                self.counts.unverified += 1
            return HTTPStatus.BAD_REQUEST
        kind = str(message.get("type", "")) if isinstance(message, dict) else ""
        webhook_id = headers.get("webhook-id", "")
        with self._lock:
            if kind == "webhook.test":
                self.counts.pings += 1
            elif webhook_id in self._seen:
                self.counts.repeated += 1  # at-least-once: a delivery may come twice
            else:
                self._seen.add(webhook_id)
                self.counts.verified += 1
                self.counts.types[kind] += 1
        return HTTPStatus.NO_CONTENT

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != PATH:
                    self.send_error(HTTPStatus.NOT_FOUND)
                    return
                if length > MAX_BODY_BYTES:
                    self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                    return
                body = self.rfile.read(length)
                headers = {name.lower(): value for name, value in self.headers.items()}
                self.send_response(receiver.received(body, headers))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # the progress line counts deliveries: no line per request

        return Handler


@contextlib.contextmanager
def receiving(counts: WebhookCounts) -> Iterator[WebhookReceiver]:
    """A started receiver, stopped at the end."""
    receiver = WebhookReceiver(counts)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
