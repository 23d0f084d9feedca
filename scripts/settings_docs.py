"""docs/configuration.md, rendered from the settings models: `python -m scripts.settings_docs`.

Every field of `groupbuy.settings.Settings` gets a row: its `config.toml` key, its
environment variable, its default, the values it accepts and what it does. The words
come from the comments of `config.toml` (the file operators edit), else from the comment
above the field in groupbuy/settings.py. Only the introduction below is written by hand.
"""

from __future__ import annotations

import ast
import re
import sys
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from groupbuy import settings as settings_module
from groupbuy.settings import ENV_ALIASES, Settings

REGENERATE = "python -m scripts.settings_docs"
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
CONFIG = ROOT / "config.toml"

INTRO = f"""\
# Configuration

<!-- Generated from groupbuy/settings.py and config.toml by scripts/settings_docs.py;
     do not edit. Regenerate with: {REGENERATE} -->

`config.toml` holds every default. Three ways override a value, the later winning:

1. a `config.toml` of your own (`groupbuy serve --config PATH`, or `GROUPBUY_CONFIG`);
2. an environment variable `GROUPBUY_<SECTION>_<NAME>`, e.g. `GROUPBUY_SERVER_PORT=9000`;
3. the flags of `groupbuy serve`: `--host`, `--port`, `--workers`.

`groupbuy --help` lists the main variables.

## Bad values

A bad value stops `groupbuy serve` and `groupbuy worker` with exit status 2 and one line:

- from a variable, the line names it:
  `groupbuy: GROUPBUY_SERVER_PORT: [server] port must be a number, got 'abc'`;
- from the file, it names the section and the key;
- a file that is not TOML is named with the line and the column.

Misspellings are caught too:

- A `GROUPBUY_*` variable that resembles a setting stops the command with status 2:
  `groupbuy: unknown environment variable GROUPBUY_REDIS_ULR (did you mean GROUPBUY_REDIS_URL?)`.
- One that resembles no setting draws one WARNING.
- An unknown key in `config.toml` is refused, naming the key it resembles.
- `GROUPBUY_CONFIG`, `GROUPBUY_KEY`, `GROUPBUY_URL` and the tests' `GROUPBUY_TEST_*` are
  not settings, and are known.

## Every setting

Each table lists one section of `config.toml`. "Accepts" is the range the service checks
at start.
"""


def _toml_comments(text: str) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """The comments of config.toml: each section's notes, and each key's words.

    A comment at the end of a key's line is that key's; indented comment lines below it
    continue it. A comment block at the start of a line is a note on its whole section."""
    sections: dict[str, list[str]] = {}
    keys: dict[tuple[str, str], str] = {}
    section = ""
    last: tuple[str, str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if header := re.fullmatch(r"\[(\w+)\]", stripped):
            section, last = header.group(1), None
            sections[section] = []
        elif stripped.startswith("#") and line[0].isspace() and last is not None:
            keys[last] += " " + stripped[1:].strip()
        elif stripped.startswith("#") and section:
            sections[section].append(stripped[1:].strip())
            last = None
        elif key := re.match(r"(\w+)\s*=", stripped):
            last = (section, key.group(1))
            _value, _hash, comment = stripped.partition(" #")
            keys[last] = comment.strip().lstrip("# ")
        else:
            last = None
    return {name: " ".join(block) for name, block in sections.items()}, keys


def _source_comments() -> dict[tuple[str, str], str]:
    """The comment lines above each field of the sections in groupbuy/settings.py."""
    source = Path(settings_module.__file__).read_text(encoding="utf-8")
    lines = source.splitlines()
    found: dict[tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                above: list[str] = []
                row = item.lineno - 2
                while row >= 0 and lines[row].strip().startswith("#"):
                    above.insert(0, lines[row].strip()[1:].strip())
                    row -= 1
                _code, _hash, trailing = lines[item.lineno - 1].partition("  # ")
                words = " ".join([*above, trailing.strip()]).strip()
                found[(node.name, item.target.id)] = words
    return found


def _value(value: Any) -> str:
    """A default as config.toml writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, int):
        return f"{value:_}".replace("_", ",") if abs(value) >= 10_000 else str(value)
    return str(value)


def _accepts(info: FieldInfo) -> str:
    """The values a field accepts, from its type and constraints."""
    annotation = info.annotation
    choices = typing.get_args(annotation)
    if len(choices) == 2 and type(None) in choices:  # `X | None`: X, or left unset
        unset = FieldInfo.from_annotation(next(c for c in choices if c is not type(None)))
        return _accepts(unset) + ", or unset"
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(f"`{_value(choice)}`" for choice in typing.get_args(annotation))
    kind = {bool: "true or false", int: "integer", float: "number", str: "string"}.get(
        typing.cast(type, annotation), "list of strings"
    )
    bounds: list[str] = []
    for item in info.metadata:
        for attribute, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(item, getattr(annotated_types, attribute.capitalize())):
                bounds.append(f"{sign} {_value(getattr(item, attribute))}")
        if isinstance(item, annotated_types.MinLen) and item.min_length:
            bounds.append("not empty")
        if getattr(item, "pattern", None):
            bounds.append(f"matching `{item.pattern}`")
    return kind + (", " + ", ".join(bounds) if bounds else "")


def _variable(section: str, name: str) -> str:
    """The environment variables that set one field (the systematic one, then any alias)."""
    names = [f"GROUPBUY_{section.upper()}_{name.upper()}"]
    names += [alias for alias, target in ENV_ALIASES.items() if target == (section, name)]
    return ", ".join(f"`{variable}`" for variable in names)


def _cell(text: str) -> str:
    """Text fit for one table cell."""
    return text.replace("|", "\\|") or "—"


def render() -> str:
    """The text of docs/configuration.md."""
    section_words, key_words = _toml_comments(CONFIG.read_text(encoding="utf-8"))
    source_words = _source_comments()
    out = [INTRO]
    for section, section_info in Settings.model_fields.items():
        model = typing.cast(type[BaseModel], section_info.annotation)
        out += [f"### [{section}]", "", (model.__doc__ or "").strip().replace("\n    ", " ")]
        if section_words.get(section):
            out += ["", section_words[section]]
        out += ["", "| key | variable | default | accepts | what it does |"]
        out += ["| --- | --- | --- | --- | --- |"]
        for name, info in model.model_fields.items():
            words = key_words.get((section, name)) or source_words.get((model.__name__, name))
            default = "(hidden)" if info.repr is False and info.default else info.default
            out.append(
                f"| `{name}` | {_variable(section, name)} | `{_value(default)}` "
                f"| {_cell(_accepts(info))} | {_cell(words or '')} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    """Write docs/configuration.md."""
    DOC.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {DOC}\n")


if __name__ == "__main__":
    main()
