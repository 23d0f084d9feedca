"""What the console's tests share: a viewer key, sign-in, and a reading of a page's HTML."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import httpx2 as httpx
from starlette.testclient import TestClient

VIEWER_KEY = "viewer-secret-for-tests"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
# What every console answer carries (the CSP checked separately).
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = _CSRF.search(html)
    assert found is not None, html[:500]
    return found.group(1)


def sign_in(client: TestClient, key: str, next_page: str = "/console") -> httpx.Response:
    """Open the sign-in page and post its form with `key` (the answer, not followed)."""
    form = client.get("/console/signin")
    assert form.status_code == 200, form.text
    return client.post(
        "/console/signin",
        data={"key": key, "csrf": csrf_of(form.text), "next": next_page},
        follow_redirects=False,
    )


def assert_secure_headers(response: httpx.Response) -> None:
    """The console's security headers: a CSP that allows scripts from the site only."""
    policy = response.headers.get("content-security-policy", "")
    directives = {part.split()[0]: part.split()[1:] for part in policy.split("; ") if part}
    assert directives.get("default-src") == ["'self'"], policy
    assert directives.get("script-src") == ["'self'"], policy
    assert directives.get("frame-ancestors") == ["'none'"], policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, policy
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (name, response.headers)


@dataclass
class PageParts(HTMLParser):
    """What the tests check in a page: scripts, inline handlers and styles, forms, and the
    text of each `data-field` inside its `data-activity` / `data-packet` panel."""

    scripts: list[tuple[dict[str, str | None], str]] = field(default_factory=list)
    inline_handlers: list[str] = field(default_factory=list)
    style_attributes: int = 0
    style_elements: int = 0
    forms: list[dict[str, str | None]] = field(default_factory=list)
    panels: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    inputs: list[dict[str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self._script: dict[str, str | None] | None = None
        self._script_text = ""
        self._panel: tuple[str, str] | None = None
        self._field: str | None = None
        self._field_text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        self.inline_handlers += [name for name in named if name.startswith("on")]
        self.style_attributes += "style" in named
        self.style_elements += tag == "style"
        if named.get("id"):
            self.ids.add(str(named["id"]))
        if tag == "script":
            self._script, self._script_text = named, ""
        if tag == "form":
            self.forms.append(named)
        if tag == "input":
            self.inputs.append(named)
        for hook in ("data-activity", "data-packet"):
            if named.get(hook):
                self._panel = (hook, str(named[hook]))
                self.panels.setdefault(self._panel, {})
        if named.get("data-field") and self._panel is not None:
            self._field, self._field_text = str(named["data-field"]), ""

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script_text += data
        if self._field is not None:
            self._field_text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, self._script_text))
            self._script = None
        if self._field is not None and self._panel is not None:
            self.panels[self._panel][self._field] = self._field_text
            self._field = None
        if tag == "section":
            self._panel = None


def parts_of(html: str) -> PageParts:
    """A page read by PageParts."""
    parts = PageParts()
    parts.feed(html)
    parts.close()
    return parts


def assert_no_inline_script(html: str) -> PageParts:
    """Scripts come from files of the site only: no inline code, handler or style attribute
    (the CSP would block them, and the browser would log an error)."""
    parts = parts_of(html)
    for attrs, text in parts.scripts:
        assert attrs.get("src", "").startswith("/console/static/"), attrs  # type: ignore[union-attr]
        assert not text.strip(), text
    assert parts.inline_handlers == [], parts.inline_handlers
    assert parts.style_attributes == 0 and parts.style_elements == 0
    return parts


def action_forms(parts: PageParts) -> list[dict[str, str | None]]:
    """The forms of a page that post an action (all but sign-out)."""
    return [
        form
        for form in parts.forms
        if form.get("method") == "post" and form.get("action") != "/console/signout"
    ]


def form_of(client: TestClient, page: str, **fields: Any) -> dict[str, Any]:
    """An action's form fields: the CSRF token of `page`, a reason and the confirmation."""
    return {"csrf": csrf_of(client.get(page).text), "reason": "tests", "confirm": "yes", **fields}


def console_context(app: Any) -> Any:
    """The console's Context inside an API app (its mounted sub-application's state)."""
    for route in app.routes:
        if getattr(route, "path", None) == "/console" and hasattr(route, "app"):
            state = getattr(route.app, "state", None)
            if state is not None and hasattr(state, "console"):
                return state.console
    raise AssertionError("the app mounts no console")
