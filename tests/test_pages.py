"""The pages for browsers: `/`, `/docs`, its assets and `/favicon.ico` (no key, not in the
OpenAPI document, no inline script, nothing from another origin)."""

from __future__ import annotations

import html
import re

from starlette.routing import Route
from starlette.testclient import TestClient

from groupbuy import __version__, errors
from groupbuy.api import pages
from groupbuy.api.problems import PROBLEMS_PATH
from tests.support.http import app_of, assert_problem

PAGES = ("/", "/docs", PROBLEMS_PATH, "/docs/assets/docs.js", "/favicon.ico")
SCRIPT_TAG = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.S)
REFERENCED = re.compile(r'(?:src|href)="([^"]+)"')


def test_the_home_page_names_the_service_its_version_and_links(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert '<h1 id="service">groupbuy</h1>' in r.text
    assert f'<span id="version">{__version__}</span>' in r.text
    for path in ("/console", "/docs", "/openapi.json", "/metrics"):
        assert f'<a href="{path}">' in r.text, path


def test_no_page_has_an_inline_script_and_the_csp_refuses_them(client: TestClient) -> None:
    for path in ("/", "/docs"):
        r = client.get(path)
        csp = r.headers["content-security-policy"]
        directives = dict(part.strip().split(" ", 1) for part in csp.split(";"))
        assert directives["script-src"] == "'self'", csp
        assert "unsafe" not in directives["default-src"], csp
        for attributes, content in SCRIPT_TAG.findall(r.text):
            assert "src=" in attributes and content.strip() == "", (path, attributes)
        assert not re.search(r"\son[a-z]+=", r.text), path  # no inline event handler
        assert r.headers["x-content-type-options"] == "nosniff"


def test_every_file_the_reference_loads_is_served_here(client: TestClient) -> None:
    r = client.get("/docs")
    assert r.status_code == 200
    referenced = REFERENCED.findall(r.text)
    assert set(referenced) == {
        "/favicon.ico",
        "/docs/assets/swagger-ui.css",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/docs.js",
    }
    for path in referenced:  # all on this origin: nothing from a CDN
        answer = client.get(path)
        assert answer.status_code == 200, path
        assert len(answer.content) > 100, path
    bundle = client.get("/docs/assets/swagger-ui-bundle.js")
    assert bundle.headers["content-type"] == "text/javascript; charset=utf-8"
    assert "SwaggerUIBundle" in bundle.text
    assert client.get("/docs/assets/swagger-ui.css").headers["content-type"].startswith("text/css")
    initializer = client.get("/docs/assets/docs.js").text
    assert 'url: "/openapi.json"' in initializer
    assert "validatorUrl: null" in initializer  # else a badge from validator.swagger.io


def test_the_favicon_is_an_icon(client: TestClient) -> None:
    r = client.get("/favicon.ico")
    assert r.status_code == 200
    assert r.headers["content-type"] == "image/x-icon"
    assert r.content[:4] == b"\0\0\1\0"  # an ICO header: reserved 0, type 1 (icon)


def test_only_the_listed_assets_are_served(client: TestClient) -> None:
    for name in ("index.html", "swagger-initializer.js", "..%2Fpages.py", "swagger-ui.js.map"):
        r = client.get(f"/docs/assets/{name}")
        assert r.status_code in (404, 422), (name, r.status_code)
        assert r.headers["content-type"].startswith("application/problem+json")
    assert_problem(client.get("/docs/assets/nothing.js"), 404, "not_found")


def test_pages_need_no_key_and_take_only_get(client: TestClient) -> None:
    for path in PAGES:
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 200
        assert client.head(path).status_code == 200, path
        assert_problem(client.post(path), 405, "method_not_allowed")


def test_pages_are_not_in_the_openapi_document(client: TestClient) -> None:
    documented = client.get("/openapi.json").json()["paths"]
    hidden = {
        route.path
        for route in app_of(client).routes
        if isinstance(route, Route) and not route.include_in_schema
    }
    assert {route.path for route in pages.ROUTES} <= hidden
    assert not hidden & set(documented)


def test_every_problem_code_is_documented_where_its_type_points(client: TestClient) -> None:
    """A problem's `type` is `/docs/problems#<code>`: that page answers here, and lists each
    code the API can answer, with its status and meaning, as the row with that id."""
    page = client.get(PROBLEMS_PATH)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for cls in errors.every_error():
        row = re.search(rf'<tr id="{cls.code}">(.*?)</tr>', page.text)
        assert row, cls.code
        assert f"<td>{cls.status_code}</td>" in row[1], row[1]
        assert html.escape(cls.title) in row[1], row[1]
    codes = [cls.code for cls in errors.every_error()]
    assert len(codes) == len(set(codes))
    assert {"team_full", "sold_out", "not_found", "invalid_request", "bad_request"} <= set(codes)
    problem = assert_problem(client.get("/no/such/route"), 404, "not_found")
    assert problem["type"] == f"{PROBLEMS_PATH}#not_found"
    path, _hash, code = problem["type"].partition("#")
    assert client.get(path).status_code == 200 and f'id="{code}"' in client.get(path).text
    assert f'<a href="{PROBLEMS_PATH}">' in client.get("/").text
