"""docs/configuration.md is the rendered settings models: every field, its variable, default
and range, in words taken from config.toml or groupbuy/settings.py."""

from __future__ import annotations

from groupbuy.settings import Settings
from scripts.settings_docs import DOC, REGENERATE, _toml_comments, render


def test_docs_configuration_md_is_the_rendered_settings() -> None:
    on_disk = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    assert render() == on_disk, f"docs/configuration.md is out of date; regenerate it: {REGENERATE}"


def test_every_field_has_a_row_with_its_variable_and_words() -> None:
    text = render()
    for section, info in Settings.model_fields.items():
        assert f"### [{section}]" in text
        for name in info.annotation.model_fields:  # type: ignore[union-attr]
            variable = f"GROUPBUY_{section.upper()}_{name.upper()}"
            rows = [
                line for line in text.splitlines() if line.startswith(f"| `{name}` | `{variable}`")
            ]
            assert len(rows) == 1, variable
            assert not rows[0].endswith("| — |"), (
                f"{variable} has no words: comment it in config.toml"
            )


def test_the_ranges_and_defaults_come_from_the_models() -> None:
    text = render()
    assert "| `port` | `GROUPBUY_SERVER_PORT` | `8000` | integer, ≥ 0, ≤ 65,535 |" in text
    assert '`"auto"` or `"server"` or `"fakeredis"`' in text
    assert "`GROUPBUY_AUTH_API_KEYS`, `GROUPBUY_API_KEYS`" in text  # the documented alias


def test_comment_parser_reads_trailing_continued_and_section_comments() -> None:
    sections, keys = _toml_comments(
        "# top of file\n[a]\n# about a\nx = 1   # the x\n        # and more\ny = 2\n# later note\n"
    )
    assert sections == {"a": "about a later note"}
    assert keys == {("a", "x"): "the x and more", ("a", "y"): ""}
