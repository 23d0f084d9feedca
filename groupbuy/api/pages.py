"""The pages for a browser that are not API: `/` (what runs here), `/docs` (the API
reference, Swagger UI over /openapi.json), their assets and `/favicon.ico`.

They need no key and are left out of the OpenAPI document (`include_in_schema=False`).
Swagger UI's files come from the swagger-ui-bundle-v2 wheel and are served from here, so
the reference works with no network. No page has an inline script: the CSP forbids them.
"""

from __future__ import annotations

import html
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Route
from swagger_ui_bundle import swagger_ui_path

from groupbuy import __version__, errors
from groupbuy.api.problems import PROBLEMS_PATH

STATIC = Path(__file__).resolve().parent / "static"
ASSETS_PATH = "/docs/assets"
# Scripts only from this origin (no 'unsafe-inline', no eval); Swagger UI sets inline
# styles and draws icons as data: images.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# The files /docs/assets serves, by name: a fixed list, so no request names another file.
ASSETS: dict[str, Path] = {
    "swagger-ui.css": Path(str(swagger_ui_path)) / "swagger-ui.css",
    "swagger-ui-bundle.js": Path(str(swagger_ui_path)) / "swagger-ui-bundle.js",
    "docs.js": STATIC / "docs.js",
}
_MEDIA_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
# Links of the home page: (path, what it is).
LINKS = (
    ("/console", "Console: watch and steer a flash event"),
    ("/docs", "API reference: every operation, try it out with a key"),
    ("/openapi.json", "OpenAPI 3.1 document"),
    (PROBLEMS_PATH, "Problem codes: what each error answer means"),
    ("/metrics", "Prometheus metrics"),
)

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="/favicon.ico">
{head}
</head>
<body>
{body}
</body>
</html>
"""
_HOME_STYLE = """<style>
body { font: 16px/1.5 system-ui, sans-serif; margin: 3rem auto; max-width: 40rem;
       padding: 0 1rem; color: #222; }
h1 { margin-bottom: 0; } .version { color: #666; margin-top: 0; }
li { margin: 0.4rem 0; } a { color: #b0182b; }
</style>"""


def page(title: str, head: str, body: str) -> HTMLResponse:
    """An HTML page with the security headers every page of the service carries."""
    text = _PAGE.format(title=html.escape(title), head=head, body=body)
    return HTMLResponse(text, headers=_HEADERS)


async def home(_request: Request) -> Response:
    links = "\n".join(
        f'<li><a href="{path}">{html.escape(path)}</a> — {html.escape(what)}</li>'
        for path, what in LINKS
    )
    body = (
        '<h1 id="service">groupbuy</h1>\n'
        f'<p class="version">version <span id="version">{html.escape(__version__)}</span></p>\n'
        "<p>Group-buy seat locking and red-packet grabbing, decided atomically in Redis.</p>\n"
        f'<ul id="links">\n{links}\n</ul>'
    )
    return page(f"groupbuy {__version__}", _HOME_STYLE, body)


async def docs(_request: Request) -> Response:
    head = f'<link rel="stylesheet" href="{ASSETS_PATH}/swagger-ui.css">'
    body = (
        '<div id="swagger-ui"></div>\n'
        f'<script src="{ASSETS_PATH}/swagger-ui-bundle.js"></script>\n'
        f'<script src="{ASSETS_PATH}/docs.js"></script>'
    )
    return page(f"groupbuy {__version__} API reference", head, body)


async def problems(_request: Request) -> Response:
    """Every problem code with its status and meaning, each row the target of the `type`
    URI of its answers (`/docs/problems#team_full`)."""
    rows = "\n".join(
        f'<tr id="{html.escape(cls.code)}"><td><code>{html.escape(cls.code)}</code></td>'
        f"<td>{cls.status_code}</td><td>{html.escape(cls.title)}</td></tr>"
        for cls in errors.every_error()
    )
    body = (
        '<h1 id="problems">Problem codes</h1>\n'
        "<p>Every error answer is <code>application/problem+json</code> (RFC 9457). Its "
        "<code>code</code> is stable: branch on it. Its <code>type</code> links here.</p>\n"
        "<table>\n<thead><tr><th>code</th><th>status</th><th>meaning</th></tr></thead>\n"
        f"<tbody>\n{rows}\n</tbody>\n</table>"
    )
    return page(f"groupbuy {__version__} problem codes", _HOME_STYLE + _TABLE_STYLE, body)


_TABLE_STYLE = """<style>
table { border-collapse: collapse; } td, th { padding: 0.2rem 0.6rem; text-align: left; }
tr:target { background: #fde8eb; }
</style>"""


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    path = ASSETS.get(name)
    if path is None:
        raise errors.NotFound(f"no asset is named {name!r}")
    return FileResponse(
        path,
        media_type=_MEDIA_TYPES[path.suffix],
        headers={**_HEADERS, "Cache-Control": "public, max-age=3600"},
    )


async def favicon(_request: Request) -> Response:
    return FileResponse(
        STATIC / "favicon.ico",
        media_type="image/x-icon",
        headers={"Cache-Control": "public, max-age=86400"},
    )


ROUTES = [
    Route("/", home, methods=["GET"], include_in_schema=False),
    Route("/docs", docs, methods=["GET"], include_in_schema=False),
    Route(PROBLEMS_PATH, problems, methods=["GET"], include_in_schema=False),
    Route(f"{ASSETS_PATH}/{{name}}", asset, methods=["GET"], include_in_schema=False),
    Route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False),
]
"""The routes of the pages; the app adds them after the API's."""
