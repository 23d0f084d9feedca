"""The Starlette application: routes from every Endpoint, one error handler, the lifespan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from groupbuy.api import audit, blocklist, pages, redpackets, system, teams, waitlist, webhooks
from groupbuy.api.access import Authenticator, FingerprintKey
from groupbuy.api.endpoints import Endpoint, build_routes, configured
from groupbuy.api.middleware import LimitBodyTime, ObserveRequests, RejectAmbiguousPaths
from groupbuy.api.openapi import build_openapi
from groupbuy.api.problems import HANDLED_ERRORS, handle_error
from groupbuy.console.app import console_routes
from groupbuy.services import Services, build_services, running
from groupbuy.settings import Settings
from groupbuy.storage.signatures import SeenSignatures

ENDPOINTS = [
    *system.ENDPOINTS,
    *teams.ENDPOINTS,
    *waitlist.ENDPOINTS,
    *redpackets.ENDPOINTS,
    *blocklist.ENDPOINTS,
    *webhooks.ENDPOINTS,
    *audit.ENDPOINTS,
]
# The router tries routes in order (a regex each): the calls of a flash event go first.
_HOT_CALLS = ("/grab", "/locks", "/members", "/locks/{user_id}")


def _route_order(endpoint: Endpoint) -> int:
    return 0 if endpoint.method != "GET" and endpoint.path.endswith(_HOT_CALLS) else 1


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The OpenAPI document an app made with these settings serves (its request limits)."""
    return build_openapi(configured(ENDPOINTS, settings))


def proxy_headers(trusted_proxies: tuple[str, ...]) -> list[Middleware]:
    """uvicorn's ProxyHeadersMiddleware trusting these proxies only (none: not installed, the
    direct peer is the client)."""
    if not trusted_proxies:
        return []
    return [Middleware(ProxyHeadersMiddleware, trusted_hosts=list(trusted_proxies))]


def create_app(settings: Settings, services: Services | None = None) -> Starlette:
    """The ASGI application; its lifespan starts and stops the services (services.running)."""
    services = services or build_services(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with running(services):
            with contextlib.suppress(Exception):  # Redis away: read at the first need
                await fingerprints.get()
            yield

    signing = settings.auth
    seen = SeenSignatures(services.redis, services.keys, 2 * signing.signature_skew_s * 1000)
    fingerprints = FingerprintKey(
        signing.fingerprint_secret, services.redis, services.keys.fingerprint_secret()
    )
    auth = Authenticator(
        signing.keys,
        seen,
        fingerprints=fingerprints,
        signed_requests=signing.signed_requests,
        skew_s=signing.signature_skew_s,
    )
    endpoints = configured(ENDPOINTS, settings)  # request limits from the settings
    app = Starlette(
        routes=[
            *build_routes(
                sorted(endpoints, key=_route_order), auth, settings.server.max_body_bytes
            ),
            *pages.ROUTES,  # for browsers, not in the OpenAPI document
            *console_routes(settings, services, auth),  # /console: the operators' pages
        ],
        exception_handlers={cls: handle_error for cls in HANDLED_ERRORS},
        lifespan=lifespan,
        middleware=[
            # The client's address from X-Forwarded-For, only when a trusted proxy sent it
            # (the throttle of key guessing counts by it; the access log shows it).
            *proxy_headers(settings.auth.trusted_proxies),
            Middleware(ObserveRequests, access_log=settings.log.access_log),
            Middleware(LimitBodyTime, timeout_s=settings.server.body_timeout_s),
            Middleware(RejectAmbiguousPaths),
        ],
    )
    app.router.redirect_slashes = False  # a trailing '/' is an empty id, not another route
    app.state.services = services
    app.state.openapi = build_openapi(endpoints)
    return app
