"""docs/api.md is the reference rendered from the OpenAPI document, and says what it must."""

from __future__ import annotations

from pathlib import Path

from groupbuy.api.app import ENDPOINTS
from groupbuy.api.reference import current_markdown, render_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
REGENERATE = "python -m groupbuy.api.reference --write docs/api.md"


def test_docs_api_md_is_the_rendered_reference() -> None:
    assert DOC.read_text(encoding="utf-8") == current_markdown(), (
        f"docs/api.md is out of date with the API; run `{REGENERATE}`"
    )


def test_every_endpoint_and_error_code_is_in_the_reference() -> None:
    text = current_markdown()
    for endpoint in ENDPOINTS:
        assert f"### `{endpoint.method} {endpoint.path}`" in text
    for code in (
        "team_full",
        "lock_required",
        "already_member",
        "sold_out",
        "expired",
        "packet_not_found",
        "insufficient_funds",
        "invalid_request",
        "unauthorized",
        "forbidden",
        "redis_unavailable",
    ):
        assert f"{code}" in text, code


def test_the_renderer_describes_bodies_parameters_and_answers() -> None:
    openapi = {
        "paths": {
            "/v1/things/{thing_id}": {
                "post": {
                    "summary": "Make a thing",
                    "tags": ["things"],
                    "security": [{"bearer": []}],
                    "description": "Needs an `admin` key.",
                    "parameters": [
                        {
                            "name": "thing_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                        }
                    ],
                    "requestBody": {
                        "content": {
                            "application/json": {
                                "schema": {
                                    "required": ["size"],
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 2, "maximum": 9},
                                        "kind": {"enum": ["a", "b"], "default": "a"},
                                    },
                                }
                            }
                        }
                    },
                    "responses": {"409": {"description": "thing_taken"}},
                }
            }
        }
    }
    text = render_markdown(openapi)
    assert "### `POST /v1/things/{thing_id}`" in text
    assert "Make a thing. Needs an `admin` key." in text
    assert "| `thing_id` | path | id | required |" in text
    assert "| `size` | integer 2..9 | required |" in text
    assert '| `kind` | one of `a`, `b` | default `"a"` |' in text
    assert "| 409 | thing_taken |" in text
