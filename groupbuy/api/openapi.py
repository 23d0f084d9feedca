"""The OpenAPI 3.1 document, generated from the same Endpoint list that builds the routes."""

from __future__ import annotations

import re
from typing import Any

from groupbuy import __version__
from groupbuy.api.endpoints import ID_PATTERN, Endpoint

_PROBLEM = {
    "type": "object",
    "required": ["type", "title", "status", "code", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "code": {"type": "string", "description": "stable snake_case error code"},
        "detail": {"type": "string"},
    },
    "additionalProperties": True,
}


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": ID_PATTERN},
        }
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]
    if endpoint.query is not None:
        schema = endpoint.query.model_json_schema()
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            params.append(
                {"name": name, "in": "query", "required": name in required, "schema": prop}
            )
    responses: dict[str, Any] = {}
    for status, text in sorted(endpoint.responses.items()):
        media = endpoint.media_type if status < 400 else "application/problem+json"
        schema = {"$ref": "#/components/schemas/Problem"}
        if status < 400:
            schema = {"type": "object" if media == "application/json" else "string"}
        responses[str(status)] = {"description": text, "content": {media: {"schema": schema}}}
    if endpoint.body is not None or params:
        responses.setdefault("422", _problem("invalid_request: bad JSON, fields, numbers or ids"))
    if endpoint.body is not None:
        responses.setdefault("413", _problem("payload_too_large: body over the size limit"))
    if endpoint.role is not None:
        responses.setdefault("401", _problem("unauthorized: missing or wrong API key"))
        responses.setdefault("403", _problem("forbidden: the key's role may not call this"))
        responses.setdefault(
            "503", _problem("redis_unavailable / database_unavailable: a backing service is down")
        )
    operation: dict[str, Any] = {
        "summary": endpoint.summary,
        "operationId": endpoint.handler.__name__,
        "tags": [endpoint.tag],
        "parameters": params,
        "responses": responses,
    }
    if endpoint.role is not None:
        operation["security"] = [{"bearer": []}]
        operation["description"] = (
            "Needs a `service` key (or `admin`)."
            if endpoint.role == "service"
            else f"Needs an `{endpoint.role}` key."
        )
    else:
        operation["security"] = []
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": endpoint.body.model_json_schema()}},
        }
    return operation


def _problem(text: str) -> dict[str, Any]:
    return {
        "description": text,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }


def build_openapi(endpoints: list[Endpoint]) -> dict[str, Any]:
    """The whole OpenAPI document."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "groupbuy",
            "version": __version__,
            "description": "Group-buy seat locking and red-packet grabbing, decided in Redis.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Problem": _PROBLEM},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
