"""Templates and the answers built from them: pages, the sign-in redirect, error pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from groupbuy import __version__
from groupbuy.console.identity import SIGN_IN, Operator, csrf_token

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals["version"] = __version__
templates.env.filters["query"] = lambda values: urlencode(
    {name: value for name, value in values.items() if value not in (None, "")}
)

NAVIGATION = (
    ("overview", "/console", "Overview"),
    ("activities", "/console/activities", "Activities"),
    ("packets", "/console/redpackets", "Red packets"),
    ("events", "/console/events", "Events"),
    ("integrity", "/console/integrity", "Integrity"),
    ("webhooks", "/console/webhooks", "Webhooks"),
    ("blocked", "/console/blocked-users", "Blocked users"),
    ("audit", "/console/audit", "Audit log"),
)


def page(
    request: Request,
    template: str,
    operator: Operator | None,
    status: int = 200,
    **context: Any,
) -> Response:
    """A console page in the shared layout, with the operator, the CSRF token and the
    message an action left for this page."""
    notice = request.session.pop("notice", None) if operator is not None else None
    return templates.TemplateResponse(
        request,
        template,
        {
            "operator": operator,
            "csrf": csrf_token(request),
            "navigation": NAVIGATION,
            "notice": notice,
            **context,
        },
        status_code=status,
    )


def to_sign_in(request: Request) -> Response:
    """303 to the sign-in, with `next` the address asked for (GET) or the page to go
    back to."""
    target = request.url.path.rstrip("/")  # `/console` is served as the console's `/`
    if request.url.query:
        target += "?" + request.url.query
    if request.method != "GET":
        target = "/console"
    return RedirectResponse(f"{SIGN_IN}?next={quote(target, safe='')}", status_code=303)


def error_page(
    request: Request, operator: Operator | None, status: int, title: str, detail: str
) -> Response:
    """An error as a page of the console (its status and a sentence)."""
    return page(request, "error.html", operator, status, title=title, detail=detail)
