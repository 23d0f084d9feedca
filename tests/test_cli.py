"""The `groupbuy` command line: help texts, and configuration errors as one line each."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import select

from groupbuy import __version__
from groupbuy.cli import _check_database, main
from groupbuy.redpacket.models import AccountRow, GrabRow
from groupbuy.settings import SettingsError, load_settings
from groupbuy.storage.db import Database
from tests.support.http import ADMIN, SERVICE
from tests.support.servers import free_port
from tests.support.service import Service, run_groupbuy, service_environment, start_service


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_help_names_the_configuration_once(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of([], capsys)
    for words in (
        "config.toml",
        "GROUPBUY_CONFIG",
        "GROUPBUY_<SECTION>_<NAME>",
        "GROUPBUY_REDIS_URL",
        "GROUPBUY_DATABASE_URL",
        "GROUPBUY_API_KEYS",
        "GROUPBUY_SERVER_PORT",
        "GROUPBUY_LOG_FORMAT",
    ):
        assert text.count(words) >= 1, words
    for command in (["serve"], ["worker"], ["db"], ["db", "current"]):
        page = help_of(command, capsys)
        assert "GROUPBUY_<SECTION>_<NAME>" not in page and "configuration:" not in page, page
    for command in (["serve"], ["worker"], ["db"]):
        assert "`groupbuy --help`" in help_of(command, capsys), command


def test_the_description_is_a_whole_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of([], capsys)
    assert "`groupbuy worker` the background." not in text
    assert "`groupbuy worker` runs only the scheduled jobs" in " ".join(text.split())


@pytest.mark.parametrize("command", [["serve"], ["worker"], ["db"], ["demo"]])
def test_each_command_is_one_wrapped_paragraph_then_its_exit_status(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_of(command, capsys)
    about = text.split("\n\n")[1]  # after the usage
    assert all(len(line) <= 79 for line in about.splitlines()), about
    assert "\n\n" not in about and about.endswith("."), about
    assert "exit status:" in text


def test_db_help_lists_every_subcommand_and_marks_revision(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_of(["db"], capsys)
    for step in ("upgrade", "downgrade", "current", "history", "revision"):
        assert re.search(rf"^    {step} +\S", text, re.MULTILINE), step
    assert re.search(r"^    revision +for developers", text, re.MULTILINE)
    top = help_of([], capsys)
    assert "upgrade, downgrade, current, history, revision" in " ".join(top.split())


def test_a_missing_subcommand_names_the_choices_not_an_internal_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["db"], []):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "db_command" not in err and "required: {" in err, err
        assert "command" not in err.splitlines()[-1].replace("subcommand", ""), err


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "{c}", "db", "current"],
        ["db", "--config", "{c}", "current"],
        ["db", "current", "--config", "{c}"],
    ],
)
def test_options_go_before_or_after_the_subcommand(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server]\nport = 'abc'\n")
    assert main([part.format(c=config) for part in argv]) == 2
    assert capsys.readouterr().err == "groupbuy: [server] port must be a number, got 'abc'\n"


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


# -- start-up: the "listening" line only once the service listens -------------------------


def fakeredis_environment(directory: Path, **variables: str) -> dict[str, str]:
    return service_environment(directory, GROUPBUY_EMBEDDED_ENGINE="fakeredis", **variables)


def test_a_port_in_use_is_one_line_and_no_listening(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_groupbuy(tmp_path, fakeredis_environment(tmp_path), "serve", "--port", str(port))
    assert done.returncode == 1, done
    assert "listening" not in done.stdout
    assert done.stderr.splitlines()[-1] == f"groupbuy: port {port} on 127.0.0.1 is in use"
    assert "Traceback" not in done.stderr and "Errno" not in done.stderr, done.stderr


UNOPENABLE = "sqlite+aiosqlite:////nonexistent-dir/x/groupbuy.db"


def test_no_listening_line_when_the_app_cannot_start(tmp_path: Path) -> None:
    """The database cannot be opened: the start stops at the schema, in one line, and no
    line said it listened."""
    env = fakeredis_environment(tmp_path, GROUPBUY_DATABASE_URL=UNOPENABLE)
    done = run_groupbuy(tmp_path, env, "serve", "--port", "0")
    assert done.returncode == 3, done
    assert "listening" not in done.stdout, done.stdout
    assert done.stderr.splitlines() == [
        f"groupbuy: the service did not start: database {UNOPENABLE}: unable to open database file"
    ]


@pytest.mark.real
def test_no_listening_line_when_workers_cannot_start(tmp_path: Path, real_redis_url: str) -> None:
    """The parent opens the database (and migrates SQLite) before any worker starts."""
    env = service_environment(
        tmp_path, GROUPBUY_REDIS_URL=real_redis_url, GROUPBUY_DATABASE_URL=UNOPENABLE
    )
    done = run_groupbuy(tmp_path, env, "serve", "--port", "0", "--workers", "2")
    assert done.returncode == 3, done
    assert "listening" not in done.stdout, done.stdout
    assert done.stderr.splitlines() == [
        f"groupbuy: the service did not start: database {UNOPENABLE}: unable to open database file"
    ]


def test_the_listening_line_comes_when_requests_are_answered(tmp_path: Path) -> None:
    """The moment the line is printed, the port answers and the app has started."""
    port = free_port()
    output = tmp_path / "serve.log"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "groupbuy.cli", "serve", "--port", str(port)],
            cwd=tmp_path,
            env=fakeredis_environment(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in output.read_text():
            assert process.poll() is None, output.read_text()
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.01)
        answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert answer.status_code == 200, answer.text
        assert f"listening on http://127.0.0.1:{port}\n" in output.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0, output.read_text()


@pytest.mark.real
def test_serve_records_into_the_database_and_stops_cleanly(
    tmp_path: Path, real_redis_url: str, database_url: str
) -> None:
    """`groupbuy serve` on a real Redis and this database: a grab it answered is a grab row
    and a credited balance in SQL once the write-behind has run, and SIGTERM stops it with 0."""
    with redis.Redis.from_url(real_redis_url) as admin:
        admin.flushall()
    env = service_environment(
        tmp_path, GROUPBUY_REDIS_URL=real_redis_url, GROUPBUY_DATABASE_URL=database_url
    )
    service = start_service(tmp_path, env=env)
    try:
        with httpx.Client(base_url=service.url, timeout=10) as http:
            deposit = {"amount_cents": 1_000, "reference": "funds"}
            answer = http.post("/v1/accounts/alice/deposits", json=deposit, headers=ADMIN)
            assert answer.status_code == 201, answer.text
            packet = {"sender_id": "alice", "amount_cents": 1_000, "count": 4, "packet_id": "p"}
            assert http.post("/v1/redpackets", json=packet, headers=SERVICE).status_code == 201
            grab = http.post("/v1/redpackets/p/grab", json={"user_id": "u1"}, headers=SERVICE)
            assert grab.status_code == 200 and grab.json()["status"] == "grabbed", grab.text
            flushed = http.post("/v1/admin/jobs/flush_records/run", headers=ADMIN)
            assert flushed.status_code == 200 and flushed.json()["backlog"] == 0, flushed.text
    finally:
        assert service.stop() == 0, service.text()

    async def recorded() -> tuple[list[tuple[str, int]], int]:
        database = Database(database_url)
        try:
            async with database.sessions() as session:
                grabs = (await session.execute(select(GrabRow.user_id, GrabRow.amount_cents))).all()
                balance = await session.scalar(
                    select(AccountRow.balance_cents).where(AccountRow.user_id == "u1")
                )
            return [(str(user), int(cents)) for user, cents in grabs], int(balance or 0)
        finally:
            await database.dispose()

    grabs, balance = asyncio.run(recorded())
    amount = grab.json()["amount_cents"]
    assert grabs == [("u1", amount)]
    assert balance == amount


def test_a_missing_database_driver_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec

    def without_asyncpg(name: str, *args: Any) -> Any:
        return None if name == "asyncpg" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_asyncpg)
    monkeypatch.setenv("GROUPBUY_DATABASE_URL", "postgres://u:secret@127.0.0.1:1/db")
    monkeypatch.setenv("GROUPBUY_EMBEDDED_ENGINE", "fakeredis")
    monkeypatch.chdir(tmp_path)
    for command in ("serve", "worker"):
        assert main([command]) == 2
        captured = capsys.readouterr()
        assert "listening" not in captured.out
        [line] = captured.err.splitlines()
        assert line == (
            "groupbuy: the database URL postgresql+asyncpg://... needs the asyncpg driver: "
            "pip install 'groupbuy[postgres]'"
        )


@pytest.mark.parametrize(
    ("given", "effective"),
    [
        ("postgres://u:p@h:5432/db", "postgresql+asyncpg://u:p@h:5432/db"),
        ("postgresql://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("sqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("", "sqlite+aiosqlite:///groupbuy.db"),
    ],
)
def test_plain_database_schemes_are_read_as_their_async_driver(given: str, effective: str) -> None:
    settings = load_settings(None, {"GROUPBUY_DATABASE_URL": given})
    assert settings.database.effective_url == effective


@pytest.mark.parametrize(
    "url", ["mysql://u@h/db", "postgresql+psycopg2://u@h/db", "groupbuy.db", "sqlite+pysqlite:///x"]
)
def test_other_database_urls_are_refused_with_the_right_form(url: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(None, {"GROUPBUY_DATABASE_URL": url})
    message = str(raised.value)
    assert message.startswith("GROUPBUY_DATABASE_URL: [database] url: ")
    assert "postgresql+asyncpg://" in message and "sqlite+aiosqlite://" in message


def test_the_rewritten_scheme_is_said_in_a_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(None, {"GROUPBUY_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"})
    with caplog.at_level(logging.INFO, logger="groupbuy.cli"):
        _check_database(settings)
    [record] = caplog.records
    assert (
        record.getMessage()
        == "database URL sqlite:// is read as sqlite+aiosqlite:// (the async driver)"
    )


# -- the first hour: no surprises -------------------------------------------------------------


def test_a_misspelt_variable_stops_the_start_naming_the_one_it_resembles(tmp_path: Path) -> None:
    env = fakeredis_environment(tmp_path, GROUPBUY_REDIS_ULR="redis://127.0.0.1:6379/0")
    done = run_groupbuy(tmp_path, env, "serve", "--port", "0")
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "groupbuy: unknown environment variable GROUPBUY_REDIS_ULR "
        "(did you mean GROUPBUY_REDIS_URL?)"
    ]


def test_db_current_in_an_empty_directory_creates_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUPBUY_")}
    done = run_groupbuy(tmp_path, env, "db", "current")
    assert done.returncode == 0, done
    assert list(tmp_path.iterdir()) == []  # no groupbuy.db, not even an empty one
    assert done.stdout == (
        f"none: sqlite+aiosqlite:///{tmp_path}/groupbuy.db: no database file yet; "
        "`groupbuy serve` creates it at 0008\n"
    )
    assert "upgrade" not in done.stdout and done.stderr == ""
    checked = run_groupbuy(tmp_path, env, "db", "current", "--check")
    assert checked.returncode == 1 and list(tmp_path.iterdir()) == []


def test_db_current_on_a_sqlite_file_behind_says_serve_upgrades_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROUPBUY_")}
    assert run_groupbuy(tmp_path, env, "db", "upgrade", "0004").returncode == 0
    done = run_groupbuy(tmp_path, env, "db", "current")
    assert done.returncode == 0, done
    assert done.stdout == (
        f"0004: sqlite+aiosqlite:///{tmp_path}/groupbuy.db: "
        "`groupbuy serve` upgrades it to 0008 at start\n"
    )


def wait_for_text(service: Service, text: str) -> str:
    """The service's output once it contains `text` (bounded)."""
    deadline = time.monotonic() + 30
    while text not in service.text():
        assert service.process.poll() is None, service.text()
        assert time.monotonic() < deadline, service.text()
        time.sleep(0.02)
    return service.text()


def without_keys(directory: Path) -> dict[str, str]:
    env = fakeredis_environment(directory)
    del env["GROUPBUY_API_KEYS"]
    return env


def test_the_development_key_survives_a_restart_and_is_owner_only(tmp_path: Path) -> None:
    keys = []
    for _ in range(2):
        service = start_service(tmp_path, env=without_keys(tmp_path))
        try:
            text = wait_for_text(service, "export GROUPBUY_KEY=")
            key = re.search(r"export GROUPBUY_KEY=(\S+)", text)
            assert key, text
            keys.append(key[1])
            answer = httpx.get(
                f"{service.url}/v1/events", headers={"Authorization": f"Bearer {key[1]}"}
            )
            assert answer.status_code == 200, answer.text
        finally:
            assert service.stop() == 0, service.text()
    assert keys[0] == keys[1]
    kept = tmp_path / "data" / "dev-admin-key"
    assert kept.read_text().strip() == keys[0]
    assert kept.stat().st_mode & 0o777 == 0o600
    assert f"kept in {kept}" in service.text()


def test_a_generated_key_beyond_loopback_is_refused_in_one_line(tmp_path: Path) -> None:
    done = run_groupbuy(tmp_path, without_keys(tmp_path), "serve", "--host", "0.0.0.0")
    assert done.returncode == 2, done
    [line] = done.stderr.splitlines()
    assert "GROUPBUY_API_KEYS" in line and "0.0.0.0" in line, line
    assert not (tmp_path / "data" / "dev-admin-key").exists()


def test_start_up_lines_link_the_pages_and_show_the_database_absolute(tmp_path: Path) -> None:
    env = fakeredis_environment(tmp_path, GROUPBUY_DATABASE_URL="sqlite:///relative.db")
    service = start_service(tmp_path, env=env)
    try:
        text = wait_for_text(service, "database:")
        assert f"  home:     {service.url}/  (what runs here)\n" in text
        assert f"  API docs: {service.url}/docs\n" in text
        assert f"  database: sqlite+aiosqlite:///{tmp_path}/relative.db\n" in text
        assert httpx.get(f"{service.url}/").status_code == 200
    finally:
        assert service.stop() == 0, service.text()


def test_ctrl_c_ends_with_a_stopped_line(tmp_path: Path) -> None:
    service = start_service(tmp_path, env=fakeredis_environment(tmp_path))
    wait_for_text(service, "listening on")
    service.process.send_signal(signal.SIGINT)
    assert service.process.wait(timeout=30) == 0, service.text()
    assert service.text().splitlines()[-1] == f"groupbuy {__version__} stopped", service.text()
