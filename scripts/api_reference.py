"""docs/api.md, rendered from the OpenAPI document: `python -m scripts.api_reference --write`.

The reference is generated so that it cannot drift from the routes: endpoints, roles,
parameters, bodies, answers and problem codes all come from `build_openapi(ENDPOINTS)`.
Only the introduction below is written by hand; the closing table of event types comes
from groupbuy.event_types (scripts/event_docs.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from groupbuy_client.wire import ID_PATTERN
from groupbuy_client.wire import TIMESTAMP_PATTERN as _TIMESTAMP_PATTERN

from scripts.event_docs import render_table

REGENERATE = "python -m scripts.api_reference --write docs/api.md"
DEFAULT_PATH = "docs/api.md"

_TAG_TITLES = {
    "operations": "Health, readiness, metrics",
    "events": "Events feed",
    "admin": "Administration",
    "activities": "Activities",
    "teams": "Teams and seat locks",
    "accounts": "Accounts",
    "redpackets": "Red packets",
    "webhooks": "Webhooks",
}

INTRO = f"""\
# groupbuy HTTP API reference

<!-- Generated from the OpenAPI document by scripts/api_reference.py; do not edit.
     Regenerate with: {REGENERATE} -->

The service answers JSON over HTTP. The business endpoints live under `/v1`;
`/healthz`, `/readyz`, `/metrics` and `/openapi.json` need no key. The same
description, machine-readable, is served at `GET /openapi.json` (OpenAPI 3.1).

## Conventions

**Keys and roles.** Send `Authorization: Bearer <secret>`. Keys are configured as
`role:secret` pairs (`[auth] api_keys` in `config.toml`, or the environment variable
`GROUPBUY_API_KEYS="admin:<secret>,service:<secret>"`, which wins over the file); each
secret has 20 characters or more, else the service refuses to start. A
`service` key may call the business endpoints; an `admin` key may call everything; a
`viewer` key may call every GET (the admin reads included) and nothing else. No key or
an unknown one answers 401 `unauthorized` (with `WWW-Authenticate: Bearer`); a `service`
key on an admin endpoint, or a `viewer` key on anything but a GET, answers 403
`forbidden`. Each operation lists the roles it accepts (`x-roles` in `/openapi.json`).
Secrets are compared in constant time and never logged.

**Key guessing.** After `[auth] guess_limit` (10) failed authentications from one client
address within `guess_window_s` (60) seconds (401s: a missing or wrong key, a bad
signature; and failed console sign-ins), every request from that address that needs a
key answers 429 `rate_limited` with `Retry-After` (the seconds left in the window) and
`limits: ["auth-guesses"]`, until the window ends. The address is refused before its key
is looked at: a right key gets 429 too. A success does not reset the count. The count is
kept in Redis, so every process sees it; behind a proxy the address is the forwarded one
(docs/deploy.md).

**Audit log.** Every state-changing admin operation that answers 2xx writes one entry;
`x-audit` names its action. The entry holds the actor `<role>:<key fingerprint>`, the
action, the target (the path's id) and the body's `reason` when it has one. The
fingerprint is the first 16 hex digits of the HMAC-SHA256 of the secret keyed by a
server-side secret (`[auth] fingerprint_secret`), never the secret: without that secret
a reader of the log cannot test guesses of a key offline.
`GET /v1/admin/audit` pages the entries, newest first.

**Signed requests.** With `[auth] signed_requests = true` every key must sign its
requests; a key written `role+signed:secret` (e.g. `service+signed:<secret>`) must sign
whatever that setting says. A signed request also carries `X-Groupbuy-Timestamp` (Unix
seconds) and `X-Groupbuy-Signature`: the lowercase hex HMAC-SHA256, keyed by the key's
secret, of `METHOD\nTARGET\nTIMESTAMP\nBODYHASH`, where `TARGET` is the path as sent,
then `?` and the raw query string only when there is one, and `BODYHASH` the lowercase
hex SHA-256 of the body bytes (of the empty string when there is none). These answer
401 `bad_signature`, with nothing applied: a missing or wrong signature, a timestamp more
than `[auth] signature_skew_s` (300) seconds from the server's clock either way, or a
signature seen before (a replay). Its `reason` says which: `missing`, `malformed` (the
timestamp is not Unix seconds), `stale`, `wrong` or `replayed`. A request that
carries the two headers is checked even when its key need not sign. Two equal requests
signed in the same second have the same signature: the second is refused as `replayed`,
and signing it again with a later timestamp sends it (`groupbuy_client.GroupBuyClient(...,
sign=True)` signs, and does that by itself).

**Ids.** Every id, in a path or a body (`activity_id`, `team_id`, `user_id`,
`order_id`, `packet_id`, a deposit's `reference`), matches `{ID_PATTERN}`.
Anything else is refused with 422 before Redis is touched, as is a path with an
empty segment, a trailing `/` or an encoded `/`.

**Money and time.** Amounts are integer cents. Durations in requests are integer
seconds (names end in `_s`). Timestamps in answers are ISO-8601 UTC with
milliseconds, e.g. `2026-11-21T17:42:51.123Z`, all read from Redis's clock.
An integer in a request is written as one: `1.0` or `1e3` is 422, although JSON
Schema counts them as the integers 1 and 1000 (the document cannot say otherwise; its
422 answers say it in words). A decimal text read as a number can no longer be told
exact (`1.0000000000000001` reads as 1.0), and money is never a float.

**Requests.** A body is one JSON object, validated strictly. These are 422
`invalid_request`, whose `errors` lists each `field` and `message`:

- an unknown field, or a missing required one;
- a wrong type: `"3"` is not `3`;
- an out-of-range number;
- a key that appears twice in one object, at any depth: `{{"amount_cents": 1,
  "amount_cents": 700}}` is refused, not read as 700.

Unknown or repeated query parameters are 422 too. A body must be sent with
`Content-Type: application/json`; a `charset` parameter may only say `utf-8`. Any other
type, or a body with no type, is 415 `unsupported_media_type`. (`curl -d` sends a form
type: add `-H 'Content-Type: application/json'`, or use `curl --json`.) A call that takes
no body needs no type. A
body larger than `[server] max_body_bytes` (64 KiB by default) is 413
`payload_too_large`.

**Limits.** The bounds below are those of the default configuration; where a setting
sets one (`[redpackets] max_count` and `max_amount_cents` for a packet's `count` and
`amount_cents`), a server's `GET /openapi.json` shows the configured value.

**Idempotent creates.** Creates take client-chosen ids (activity, team, packet,
deposit reference). Repeating a create with the same id and the same parameters
answers 200 with the original result and changes nothing; the same id with other
parameters is 409 `conflict`.

**Rate limits.** Each business endpoint belongs to a class (seat operations, grabs,
sends, reads) and counts against its API key's limit of that class and, when it
names a user (in the path or the body), that user's limit of the class under that
key (`[ratelimit]` in `config.toml`; generous and on by default). Admin endpoints
are not limited. A counted answer carries the fields of the IETF draft "RateLimit
header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-09), one policy per
limit that applied, e.g.
`RateLimit-Policy: "grab-key";q=100000;w=1, "grab-user";q=20;w=2` (at most `q`
requests at once, refilled over `w` seconds) and
`RateLimit: "grab-key";r=99999;t=1, "grab-user";r=19;t=1` (`r` requests could
follow now; the limit is whole again in `t` seconds). Over a limit the answer is
429 `rate_limited` with `Retry-After` (whole seconds, at least 1), `retry_after_s`
and `limits` (the policies that refused), and nothing is done: try again later.
A request a limit refuses costs none of its other limits anything.
Redis decides every counted request, so a limit holds across all server processes.

**Problems.** Every error is `application/problem+json` (RFC 9457):

```json
{{
  "type": "/docs/problems#team_full",
  "title": "Every seat of the team is taken or locked",
  "status": 409,
  "code": "team_full",
  "detail": "team 't1' has no free seat",
  "next_unlock_at": "2026-11-21T17:47:51.123Z",
  "earliest_locked_at": "2026-11-21T17:42:51.123Z"
}}
```

`type` is relative to the service: `/docs/problems` lists every code with its status
and meaning, and `#<code>` is that code's row. `code` is stable and is what a client
should branch on; some codes add fields of
their own (listed below with the code). Besides the codes listed per endpoint, any
request may answer 404 `not_found` (no such route), 405 `method_not_allowed` (with
`Allow`), and every `/v1` endpoint 503 `redis_unavailable` or `database_unavailable`
when a backing service does not answer. A call that would write to Redis while Redis is
over its `maxmemory` answers 503 `redis_out_of_memory` with nothing applied (no debit, no
seat, no grab); reads still answer. With `[redis] wait_replicas = n` set, a call may
find fewer than n replicas confirmed its Redis writes within `[redis] wait_timeout_s`.
It then answers 503 `redis_replication_timeout`, with `replicas_acknowledged` and
`replicas_wanted`. The write is applied on the primary, but could be lost by a failover.
A retry answers the same once the replicas have it: `already_grabbed` with the same
amount, `existing` for a seat. A 500 `internal_error` is a bug. Every answer carries
`X-Request-Id`: the caller's, when it is a sane token, else a new one.

**Slow and oversized requests.** A request's line and headers must arrive within
`[server] header_timeout_s` (10 s by default) of the connection, or of their first byte
after a keep-alive pause: else the connection is closed without an answer. More than
`[server] max_header_count` headers (100) or more than `[server] max_header_bytes`
(16 KiB, request line included) is 431 `headers_too_large`, and the connection is
closed. A body must arrive within `[server] body_timeout_s` (20 s) of the headers: else
408 `request_timeout` (with `Connection: close`); nothing of the request is applied.
These answers come before routing and carry no `X-Request-Id` when the headers were
refused. A client that closes its connection before its body has arrived gets no
answer. The access log and the latency metric record that request with status 499
("client closed request", as nginx does), at INFO, never as an error or a 500.
"""


_EVENT_TYPES_INTRO = [
    "## Event types",
    "",
    "Every `type` of an [Event](#event) of the feed, and of a webhook delivery",
    "([webhooks.md](webhooks.md#event-types)), with its `data` fields.",
    "",
]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _anchor(title: str) -> str:
    return title.lower().replace(" ", "-")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def render_type(schema: dict[str, Any]) -> str:
    """A JSON Schema as a short type name: `id`, `integer`, `list of [Team](#team)`..."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{_anchor(name)})"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " or ".join(render_type(option) for option in schema[union])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    kind = schema.get("type")
    if kind == "string" and schema.get("pattern") == ID_PATTERN:
        return "id"
    if kind == "string" and schema.get("pattern") == _TIMESTAMP_PATTERN:
        return "timestamp"
    if kind == "array":
        return f"list of {render_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {render_type(schema['additionalProperties'])}"
    if kind == "null":
        return "null"
    return str(kind or "any")


def _bounds(schema: dict[str, Any]) -> str:
    for option in schema.get("anyOf", [schema]):
        low, high = option.get("minimum"), option.get("maximum")
        if low is not None and high is not None:
            return f"{low} .. {high}"
        if low is not None:
            return f">= {low}"
        if high is not None:
            return f"<= {high}"
        if "maxLength" in option:
            return f"at most {option['maxLength']} characters"
        pattern = option.get("pattern")
        if pattern and pattern not in (ID_PATTERN, _TIMESTAMP_PATTERN):
            return f"matches `{pattern}`"
    return ""


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
        *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows),
    ]


def _fields_table(schema: dict[str, Any], with_rules: bool) -> list[str]:
    """A table of an object's fields; a request body's also say required, default, bounds."""
    required = set(schema.get("required", []))
    properties: dict[str, Any] = schema.get("properties", {})
    described = any("description" in prop for prop in properties.values())
    header = ["Field", "Type"] + (["Required", "Default", "Bounds"] if with_rules else [])
    rows = []
    for name, prop in properties.items():
        kind = render_type(prop)
        if with_rules:
            default = "" if "default" not in prop else f"`{json.dumps(prop['default'])}`"
            row = [f"`{name}`", kind, "yes" if name in required else "no", default, _bounds(prop)]
        else:
            row = [f"`{name}`", kind + ("" if name in required else " (may be absent)")]
        rows.append(row + ([prop.get("description", "")] if described else []))
    if schema.get("additionalProperties") is True:
        rows.append(
            ["...", "any"] + [""] * (len(header) - 2) + (["further fields"] if described else [])
        )
    return _table(header + (["Meaning"] if described else []), rows)


def _role(operation: dict[str, Any]) -> str:
    roles = operation.get("x-roles")
    if not roles:
        return "none (no key needed)"
    named = [f"`{role}`" for role in roles]
    return (named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]) + " key"


def _parameters(operation: dict[str, Any]) -> list[str]:
    params = operation.get("parameters", [])
    if not params:
        return []
    lines = [
        "Parameters:",
        "",
        "| Name | In | Type | Required | Default | Bounds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for param in params:
        schema = param["schema"]
        default = "" if "default" not in schema else f"`{json.dumps(schema['default'])}`"
        lines.append(
            f"| `{param['name']}` | {param['in']} | {_cell(render_type(schema))} | "
            f"{'yes' if param['required'] else 'no'} | {default} | {_cell(_bounds(schema))} |"
        )
    return [*lines, ""]


def _body(operation: dict[str, Any]) -> list[str]:
    body = operation.get("requestBody")
    if body is None:
        return []
    schema = body["content"]["application/json"]["schema"]
    intro = f"Request body (`application/json`): {schema.get('description', '')}".rstrip()
    return [intro, "", *_fields_table(schema, with_rules=True), ""]


def _answer_body(content: dict[str, Any]) -> str:
    media, spec = next(iter(content.items()))
    schema = spec.get("schema", {})
    if media != "application/json":
        return f"`{media}`"
    return render_type(schema) if "$ref" in schema else "JSON object"


def _answers(operation: dict[str, Any]) -> list[str]:
    lines = ["Answers:", "", "| Status | Meaning | Body |", "| --- | --- | --- |"]
    problems = ["| Status | `code` | When |", "| --- | --- | --- |"]
    for status, response in operation["responses"].items():
        content = response.get("content", {})
        if "application/problem+json" in content:
            schema = content["application/problem+json"]["schema"]
            for part in schema.get("allOf", []):
                for code in part.get("properties", {}).get("code", {}).get("oneOf", []):
                    problems.append(
                        f"| {status} | `{code['const']}` | {_cell(code.get('description', ''))} |"
                    )
        else:
            lines.append(
                f"| {status} | {_cell(response['description'])} | {_answer_body(content)} |"
            )
    out = [*lines, ""]
    if len(problems) > 2:
        out += ["Problems:", "", *problems, ""]
    return out


def _operation(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    return [
        f"### `{method.upper()} {path}`",
        "",
        f"{operation['summary']}. Auth: {_role(operation)}.",
        "",
        *_parameters(operation),
        *_body(operation),
        *_answers(operation),
    ]


def _operations(openapi: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, methods in openapi["paths"].items()
        for method, operation in methods.items()
    ]


def render_markdown(openapi: dict[str, Any]) -> str:
    """The whole reference as Markdown."""
    operations = _operations(openapi)
    tags: list[str] = []
    for _path, _method, operation in operations:
        for tag in operation.get("tags", ["operations"]):
            if tag not in tags:
                tags.append(tag)
    lines = [INTRO, "## Endpoints", ""]
    lines += ["| Endpoint | What it does | Auth |", "| --- | --- | --- |"]
    for path, method, operation in operations:
        title = f"`{method.upper()} {path}`"
        anchor = "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")
        lines.append(f"| [{title}](#{anchor}) | {operation['summary']} | {_role(operation)} |")
    lines.append("")
    for tag in tags:
        lines += [f"## {_TAG_TITLES.get(tag, tag.capitalize())}", ""]
        for path, method, operation in operations:
            if tag in operation.get("tags", ["operations"]):
                lines += _operation(path, method, operation)
    lines += [
        "## Answer bodies",
        "",
        "Fields marked *may be absent* appear only in some answers; the others are always",
        "present (a value of `null` is written out).",
        "",
    ]
    for name, schema in openapi["components"]["schemas"].items():
        lines += [f"### {name}", "", schema.get("description", ""), ""]
        if "oneOf" in schema:
            by = schema.get("discriminator", {}).get("propertyName")
            lines += [f"One of {render_type(schema)}" + (f", by `{by}`." if by else "."), ""]
        else:
            lines += [*_fields_table(schema, with_rules=False), ""]
    lines += [*_EVENT_TYPES_INTRO, *render_table(), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def current_reference() -> str:
    """The reference of the API as the code defines it now, with the default settings (a
    server's /openapi.json shows its configured limits)."""
    from groupbuy.api.app import openapi_document
    from groupbuy.settings import Settings

    return render_markdown(openapi_document(Settings()))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the reference, or write it to a file with --write."""
    parser = argparse.ArgumentParser(prog="python -m scripts.api_reference", description=__doc__)
    parser.add_argument(
        "--write",
        nargs="?",
        const=DEFAULT_PATH,
        metavar="PATH",
        help=f"write the reference to PATH (default {DEFAULT_PATH}) instead of printing it",
    )
    args = parser.parse_args(argv)
    text = current_reference()
    if args.write is None:
        sys.stdout.write(text)
    else:
        Path(args.write).write_text(text, encoding="utf-8")
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
