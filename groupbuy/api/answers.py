"""The answer shapes of groupbuy_client.wire as pydantic models: for the OpenAPI document, and for
tests that validate real answers against what is documented.

Each model is derived from its TypedDict, field for field: a plain string in the field's
`Annotated` becomes its description, `Ge` and `Pattern` its constraints, a `NotRequired`
field one that may be absent (null by default), a `OneOf` union a root model told apart
by its tag. A model lists every field and forbids others, unless its shape is
`extensible`. Nothing here is written by hand per answer: the shapes are in wire.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, NotRequired, Required, Union

from groupbuy_client import wire
from pydantic import BaseModel, ConfigDict, Field, RootModel, create_model
from pydantic.fields import FieldInfo

_built: dict[object, type[BaseModel]] = {}


def model(shape: object) -> type[BaseModel]:
    """The pydantic model of a wire shape (a TypedDict, or a `OneOf` union of them)."""
    if shape not in _built:
        _built[shape] = _derive(shape)
    return _built[shape]


def validate(shape: object, body: Any) -> Any:
    """`body` checked to have the shape (ValidationError if not); the body itself."""
    model(shape).model_validate(body)
    return body


def _derive(shape: object) -> type[BaseModel]:
    if typing.is_typeddict(shape):
        return _typed_dict_model(shape)
    inner, metadata = _split(shape)
    tags = [m for m in metadata if isinstance(m, wire.OneOf)]
    if not tags or typing.get_origin(inner) not in (Union, types.UnionType):
        raise TypeError(f"not a wire shape: {shape!r}")
    choice = Annotated[_pydantic(inner), Field(discriminator=tags[0].tag)]  # type: ignore[valid-type]
    return create_model(
        _name(shape),
        __base__=RootModel[choice],  # type: ignore[valid-type]
        __doc__=next((m for m in metadata if isinstance(m, str)), None),
        __module__=__name__,
    )


def _typed_dict_model(shape: Any) -> type[BaseModel]:
    hints = typing.get_type_hints(shape, include_extras=True)
    fields: dict[str, Any] = {}
    for name, hint in hints.items():
        inner, metadata = _split(hint)
        present = name in shape.__required_keys__
        fields[name] = _field(inner, metadata, present)
    return create_model(
        shape.__name__,
        __config__=ConfigDict(extra="allow" if wire.is_extensible(shape) else "forbid"),
        __doc__=shape.__doc__,
        __module__=__name__,
        **fields,
    )


def _field(hint: Any, metadata: list[Any], present: bool) -> tuple[Any, FieldInfo]:
    """A field's (type, FieldInfo): an absent-able field may be null, null by default."""
    kind = _pydantic(hint)
    if not present and not _allows_none(kind):
        kind = kind | None
    info: dict[str, Any] = _constraints(metadata)
    descriptions = [m for m in metadata if isinstance(m, str)]
    if descriptions:
        info["description"] = descriptions[0]
    if not present:
        info["default"] = None
    return kind, Field(**info)


def _constraints(metadata: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, wire.Ge):
            found["ge"] = item.value
        elif isinstance(item, wire.Pattern):
            found["pattern"] = item.regex
    return found


def _pydantic(hint: Any) -> Any:
    """A wire type with its shapes replaced by their models and its constraints by pydantic's."""
    if typing.is_typeddict(hint):
        return model(hint)
    origin = typing.get_origin(hint)
    if origin is Annotated:
        inner, metadata = _split(hint)
        constraints = _constraints(metadata)
        converted = _pydantic(inner)
        return Annotated[converted, Field(**constraints)] if constraints else converted
    if origin in (Union, types.UnionType):
        return Union[tuple(_pydantic(arg) for arg in typing.get_args(hint))]  # noqa: UP007
    if origin in (list, dict):
        return origin[tuple(_pydantic(arg) for arg in typing.get_args(hint))]
    if origin is Literal or hint is Any or isinstance(hint, type):
        return hint
    raise TypeError(f"no model for the wire type {hint!r}")


def _split(hint: Any) -> tuple[Any, list[Any]]:
    """The type under `Annotated` and `NotRequired`, and the metadata found on the way."""
    metadata: list[Any] = []
    while True:
        origin = typing.get_origin(hint)
        if origin is Annotated:
            metadata.extend(hint.__metadata__)
            hint = hint.__origin__
        elif origin in (NotRequired, Required):
            (hint,) = typing.get_args(hint)
        else:
            return hint, metadata


def _allows_none(kind: Any) -> bool:
    return kind is type(None) or type(None) in typing.get_args(kind)


def _name(shape: object) -> str:
    """A union shape's name: the one wire gives it."""
    for name, value in vars(wire).items():
        if value is shape:
            return name
    raise TypeError(f"not a named wire shape: {shape!r}")
