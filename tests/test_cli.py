"""The `groupbuy` command line: help texts, and configuration errors as one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from groupbuy.cli import main


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["worker", "--help"]])
def test_help_exits_0_and_names_the_configuration(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for words in (
        "config.toml",
        "GROUPBUY_CONFIG",
        "GROUPBUY_<SECTION>_<NAME>",
        "GROUPBUY_REDIS_URL",
        "GROUPBUY_DATABASE_URL",
        "GROUPBUY_API_KEYS",
    ):
        assert words in text, words


def test_the_description_is_a_whole_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "`groupbuy worker` the background." not in text
    assert "`groupbuy worker` runs only the scheduled jobs" in text


def test_serve_help_names_the_server_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    for name in ("GROUPBUY_SERVER_PORT", "GROUPBUY_SERVER_WORKERS", "exit status"):
        assert name in text, name


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_toml_syntax_error_is_one_line_and_exit_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server\nport = 1\n")
    assert main([command, "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(f"groupbuy: {config} is not valid TOML: ")


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_bad_variable_is_named_in_the_one_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GROUPBUY_SERVER_PORT", "abc")
    monkeypatch.delenv("GROUPBUY_CONFIG", raising=False)
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    assert main([command]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == "groupbuy: GROUPBUY_SERVER_PORT: [server] port must be a number, got 'abc'"
