"""groupbuy_client.wire: each answer shape written once, in a module the client can depend on alone;
the OpenAPI document's models are derived from it field for field."""

from __future__ import annotations

import ast
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from groupbuy_client import wire
from pydantic import ValidationError

from groupbuy.api import answers

WIRE = Path(wire.__file__)
SHAPES = [
    value
    for name, value in vars(wire).items()
    if typing.is_typeddict(value) and not name.startswith("_")
]


def test_wire_imports_only_the_standard_library() -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(WIRE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, ast.dump(node)
            imported.add(node.module.split(".")[0])
    assert imported and imported <= sys.stdlib_module_names, imported


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.__name__)
def test_each_model_has_the_fields_of_its_shape(shape: Any) -> None:
    model = answers.model(shape)
    assert model.__name__ == shape.__name__
    assert model.__doc__ == shape.__doc__
    fields = shape.__required_keys__ | shape.__optional_keys__
    assert fields == set(model.model_fields)
    optional = {name for name, info in model.model_fields.items() if not info.is_required()}
    assert shape.__optional_keys__ == optional


LOCK: wire.LockTaken = {
    "status": "locked",
    "user_id": "u1",
    "team_id": "t1",
    "locked_at": "2026-11-21T17:42:51.123Z",
    "expires_at": "2026-11-21T17:43:51.123Z",
    "released_team_id": None,
    "version": 2,
}


def test_an_answer_is_checked_against_its_shape() -> None:
    assert answers.validate(wire.LockTaken, LOCK) is LOCK
    answers.validate(wire.LockTaken, {**LOCK, "existing": True})
    refused: list[dict[str, Any]] = [
        {**LOCK, "surprise": 1},  # a field the shape does not list
        {k: v for k, v in LOCK.items() if k != "version"},  # a required field missing
        {**LOCK, "locked_at": "2026-11-21 17:42:51"},  # not a Timestamp
        {**LOCK, "team_id": "t/1"},  # not an Id
        {**LOCK, "existing": False},  # Literal[True]
        {**LOCK, "status": "held"},
    ]
    for body in refused:
        with pytest.raises(ValidationError):
            answers.validate(wire.LockTaken, body)
    activity = answers.model(wire.Activity).model_json_schema()
    assert activity["properties"]["teams_open"]["minimum"] == 0


def test_an_extensible_shape_takes_more_fields_and_a_union_its_tagged_member() -> None:
    document = {"openapi": "3.1.0", "info": {}, "paths": {}, "components": {}, "x-more": 1}
    answers.validate(wire.OpenApiDocument, document)
    with pytest.raises(ValidationError):
        answers.validate(wire.OpenApiDocument, {**document, "openapi": "3.0.3"})
    report = {"job": "expire_packets", "duration_ms": 1.5, "due": 2, "expired": 2}
    answers.validate(wire.JobReport, report)
    with pytest.raises(ValidationError):
        answers.validate(wire.JobReport, {**report, "job": "repair"})
    assert answers.model(wire.JobReport).__name__ == "JobReport"
