"""docs/api.md, rendered from the OpenAPI document so the reference cannot drift from the API.

    python -m groupbuy.api.reference --write docs/api.md   # regenerate
    python -m groupbuy.api.reference                       # print it

tests/test_api_reference.py fails when docs/api.md differs from what this renders.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

INTRO = """\
# groupbuy HTTP API

Generated from the OpenAPI document the service serves at `GET /openapi.json`
(`python -m groupbuy.api.reference --write docs/api.md`); do not edit by hand.

## Conventions

- **Auth.** `Authorization: Bearer <key>`. A key has a role: `service` may call the
  business endpoints, `admin` may call everything. No or a wrong key: `401 unauthorized`;
  a key whose role may not call the endpoint: `403 forbidden`. `/healthz`, `/readyz`,
  `/metrics` and `/openapi.json` need no key.
- **Ids** (`activity_id`, `team_id`, `user_id`, `packet_id`, `order_id`, `reference`)
  match `^[A-Za-z0-9_-]{1,64}$`, in the path as in bodies; anything else is refused
  with `422 invalid_request` before anything is read or written.
- **Money** is integer cents. **Times** in answers are ISO-8601 UTC with milliseconds
  (`2026-11-21T17:42:51.123Z`); durations in requests are integer seconds.
- **Bodies** are JSON objects; unknown fields, wrong types (`"3"` for `3`) and
  duplicate query parameters are refused with `422`. Bodies over the configured size
  get `413 payload_too_large`.
- **Errors** are `application/problem+json` (RFC 9457) with a stable snake_case
  `code`: `{"type", "title", "status", "code", "detail", ...}`; some carry context
  (`team_full` carries `next_unlock_at` and `earliest_locked_at`; `invalid_request`
  carries `errors: [{field, message}]`). When Redis or the database cannot be reached
  the answer is `503` with `redis_unavailable` or `database_unavailable`; retry later.
- **Repeats are safe.** Creating calls answer `201` when they created something and
  `200` with the same result when the same request was already applied.
- Every answer carries `X-Request-Id` (the caller's own when it sent a sane one).
"""


def _type_of(schema: dict[str, Any]) -> str:
    """A short type description of a JSON schema: `integer 1..50`, `string (id)`, …"""
    if "anyOf" in schema:
        kinds = [_type_of(s) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(kinds) + (" or null" if nullable else "")
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    kind = str(schema.get("type", "any"))
    if kind == "string" and schema.get("pattern") == "^[A-Za-z0-9_-]{1,64}$":
        return "id"
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f"{kind} {low}..{high}"
    if low is not None:
        return f"{kind} >= {low}"
    if "maxLength" in schema:
        return f"{kind} (at most {schema['maxLength']} characters)"
    return kind


def _default_of(schema: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    default = schema.get("default")
    return "optional" if default is None else f"default `{json.dumps(default)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _parameters(operation: dict[str, Any]) -> list[str]:
    rows = []
    for parameter in operation.get("parameters", []):
        schema = parameter["schema"]
        rows.append(
            f"| `{parameter['name']}` | {parameter['in']} | {_cell(_type_of(schema))} | "
            f"{_default_of(schema, bool(parameter.get('required')))} |"
        )
    if not rows:
        return []
    return ["| parameter | in | type | |", "| --- | --- | --- | --- |", *rows, ""]


def _body(operation: dict[str, Any]) -> list[str]:
    request = operation.get("requestBody")
    if request is None:
        return []
    schema = request["content"]["application/json"]["schema"]
    required = set(schema.get("required", []))
    title = "Request body: a JSON object with these fields and no others."
    lines = [f"{title} ({schema['description']})" if schema.get("description") else title, ""]
    lines += ["| field | type | |", "| --- | --- | --- |"]
    for name, prop in schema.get("properties", {}).items():
        lines.append(
            f"| `{name}` | {_cell(_type_of(prop))} | {_default_of(prop, name in required)} |"
        )
    return [*lines, ""]


def _responses(operation: dict[str, Any]) -> list[str]:
    lines = ["| status | meaning |", "| --- | --- |"]
    for status, response in sorted(operation["responses"].items()):
        lines.append(f"| {status} | {_cell(str(response['description']))} |")
    return [*lines, ""]


def _who(operation: dict[str, Any]) -> str:
    if not operation.get("security"):
        return "No key needed."
    return str(operation.get("description", "Needs a key."))


def render_markdown(openapi: dict[str, Any]) -> str:
    """The whole reference: conventions, then every operation grouped by tag."""
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, methods in openapi["paths"].items():
        for method, operation in methods.items():
            tag = operation["tags"][0] if operation.get("tags") else "operations"
            by_tag.setdefault(tag, []).append((method.upper(), path, operation))
    lines = [INTRO, "## Endpoints", ""]
    for tag, operations in by_tag.items():
        lines += [f"- {tag}: " + ", ".join(f"`{m} {p}`" for m, p, _ in operations)]
    lines.append("")
    for tag, operations in by_tag.items():
        lines += [f"## {tag.capitalize()}", ""]
        for method, path, operation in operations:
            lines += [
                f"### `{method} {path}`",
                "",
                f"{operation['summary']}. {_who(operation)}",
                "",
            ]
            lines += _parameters(operation)
            lines += _body(operation)
            lines += _responses(operation)
    return "\n".join(lines).rstrip() + "\n"


def current_markdown() -> str:
    """The reference of the API as this code builds it."""
    from groupbuy.api.app import ENDPOINTS
    from groupbuy.api.openapi import build_openapi

    return render_markdown(build_openapi(ENDPOINTS))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the reference, or write it to a file with --write."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", metavar="PATH", help="write the Markdown here")
    args = parser.parse_args(argv)
    text = current_markdown()
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
