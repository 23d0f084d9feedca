"""Settings: config.toml, environment overrides, validation."""

from __future__ import annotations

import logging
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from groupbuy.api.redpackets import Deposit, PacketSend
from groupbuy.api.teams import ActivityCreate
from groupbuy.cli import main
from groupbuy.settings import (
    ENV_ALIASES,
    NON_SETTING_PREFIXES,
    NON_SETTING_VARIABLES,
    LogSettings,
    Settings,
    SettingsError,
    load_settings,
)

ROOT = Path(__file__).resolve().parent.parent


def test_config_toml_matches_the_built_in_defaults() -> None:
    assert load_settings(ROOT / "config.toml", {}) == Settings()


def test_no_file_means_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(None, {})
    assert settings == Settings()
    assert settings.redis.embedded
    assert settings.database.effective_url == "sqlite+aiosqlite:///groupbuy.db"


def test_environment_overrides_every_section() -> None:
    settings = load_settings(
        ROOT / "config.toml",
        {
            "GROUPBUY_REDIS_URL": "redis://127.0.0.1:7000/1",
            "GROUPBUY_DATABASE_URL": "postgresql+asyncpg://u@localhost/db",
            "GROUPBUY_SERVER_PORT": "9001",
            "GROUPBUY_TEAMS_LOCK_TTL_S": "60",
            "GROUPBUY_OUTBOX_FLUSH_INTERVAL_S": "0.5",
            "GROUPBUY_API_KEYS": "admin:a1-admin-secret-0123456, service:s1-service-secret-01234",
        },
    )
    assert settings.redis.url == "redis://127.0.0.1:7000/1" and not settings.redis.embedded
    assert settings.database.effective_url == "postgresql+asyncpg://u@localhost/db"
    assert settings.server.port == 9001
    assert settings.teams.lock_ttl_s == 60
    assert settings.outbox.flush_interval_s == 0.5
    assert [(k.role, k.secret) for k in settings.auth.keys] == [
        ("admin", "a1-admin-secret-0123456"),
        ("service", "s1-service-secret-01234"),
    ]


def test_the_embedded_engine_settings_come_from_the_environment_too() -> None:
    settings = load_settings(
        ROOT / "config.toml",
        {
            "GROUPBUY_EMBEDDED_DATA_DIR": "/srv/groupbuy",
            "GROUPBUY_EMBEDDED_ENGINE": "server",
            "GROUPBUY_EMBEDDED_BINARY": "valkey-server",
        },
    )
    assert (settings.embedded.data_dir, settings.embedded.engine) == ("/srv/groupbuy", "server")
    assert settings.embedded.binary == "valkey-server"
    assert Settings().embedded.data_dir == "groupbuy-data" and Settings().embedded.engine == "auto"


def test_api_keys_variable_overrides_the_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[auth]\napi_keys = ["service:from-file-0123456789"]\n')
    assert [k.secret for k in load_settings(config, {}).auth.keys] == ["from-file-0123456789"]
    assert [
        k.secret
        for k in load_settings(
            config, {"GROUPBUY_API_KEYS": "admin:env-0123456789abcdef"}
        ).auth.keys
    ] == ["env-0123456789abcdef"]


def test_signed_requests_and_their_skew_are_settings(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[auth]\nsigned_requests = true\nsignature_skew_s = 120\n")
    auth = load_settings(config, {}).auth
    assert auth.signed_requests is True and auth.signature_skew_s == 120
    defaults = load_settings(None, {}).auth
    assert defaults.signed_requests is False and defaults.signature_skew_s == 300
    from_env = load_settings(
        None, {"GROUPBUY_AUTH_SIGNED_REQUESTS": "true", "GROUPBUY_AUTH_SIGNATURE_SKEW_S": "60"}
    ).auth
    assert from_env.signed_requests is True and from_env.signature_skew_s == 60


def test_a_key_may_be_marked_as_one_that_must_sign() -> None:
    environ = {
        "GROUPBUY_API_KEYS": "admin:a1-admin-secret-0123456,"
        "service+signed:s:2-service-secret-012,admin+signed:a3-admin-secret-0123456"
    }
    keys = load_settings(None, environ).auth.keys
    assert [(k.role, k.secret, k.signed) for k in keys] == [
        ("admin", "a1-admin-secret-0123456", False),
        ("service", "s:2-service-secret-012", True),  # a secret may still hold ':'
        ("admin", "a3-admin-secret-0123456", True),
    ]


def test_secrets_stay_out_of_reprs() -> None:
    settings = load_settings(None, {"GROUPBUY_API_KEYS": "admin:topsecret-0123456789ab"})
    assert "topsecret" not in repr(settings.auth.keys)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nope]\nx = 1\n", "unknown section"),
        ("[server]\nprot = 1\n", "unknown key(s) in [server]: prot"),
        ("[server]\nport = 'x'\n", "[server] port must be a number"),
        ("[server]\nport = 70000\n", "[server] port"),
        ("[teams]\nteam_size = 1\n", "[teams] team_size"),
        ("[auth]\napi_keys = ['root:x']\n", "[auth] api_keys"),
        ("[auth]\napi_keys = 'admin:x'\n", "list of strings"),
        ("[auth]\napi_keys = ['service+sign:x']\n", "[auth] api_keys"),
        ("[auth]\napi_keys = ['+signed:x']\n", "[auth] api_keys"),
        ("[auth]\nsigned_requests = 'maybe'\n", "[auth] signed_requests must be true or false"),
        ("[auth]\nsignature_skew_s = 0\n", "[auth] signature_skew_s"),
        ("[redis]\nkey_prefix = 'a{b'\n", "key_prefix"),
        ("[embedded]\ndatadir = 'x'\n", "unknown key(s) in [embedded]: datadir"),
        ("[embedded]\nengine = 'memcached'\n", "[embedded] engine: Input should be 'auto'"),
        ("[embedded]\ndata_dir = ''\n", "[embedded] data_dir"),
    ],
)
def test_bad_files_are_refused_with_a_message(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(config, {})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GROUPBUY_SERVER_PORT", "eighty"),
        ("GROUPBUY_OUTBOX_BATCH_SIZE", "0"),
        ("GROUPBUY_API_KEYS", "admin"),
    ],
)
def test_bad_environment_values_are_refused(name: str, value: str) -> None:
    with pytest.raises(SettingsError):
        load_settings(None, {name: value})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GROUPBUY_SERVER_PORT", "eighty", "[server] port must be a number"),
        ("GROUPBUY_OUTBOX_BATCH_SIZE", "5001", "[outbox] batch_size"),
        ("GROUPBUY_SCHEDULER_ENABLED", "maybe", "[scheduler] enabled must be true or false"),
        ("GROUPBUY_TEAMS_TEAM_SIZE", "1.5", "[teams] team_size"),
    ],
)
def test_a_bad_environment_value_names_the_setting(variable: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(None, {variable: value})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GROUPBUY_SERVER_PORT", "abc"),
        ("GROUPBUY_OUTBOX_BATCH_SIZE", "5001"),
        ("GROUPBUY_API_KEYS", "admin"),
        ("GROUPBUY_EMBEDDED_ENGINE", "memcached"),
    ],
)
def test_a_bad_environment_value_names_the_variable_first(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(None, {variable: value})
    assert str(raised.value).startswith(f"{variable}: [")


def test_a_bad_file_value_does_not_name_a_variable(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server]\nport = 'abc'\n")
    with pytest.raises(SettingsError) as raised:
        load_settings(config, {"GROUPBUY_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert str(raised.value) == "[server] port must be a number, got 'abc'"


def test_unknown_groupbuy_variables_are_warned_about_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {
        "GROUPBUY_NOTHING_LIKE_IT": "1",
        "GROUPBUY_SERVER_PORT": "9000",
        "GROUPBUY_API_KEYS": "admin:a-admin-secret-01234567",
        "GROUPBUY_CONFIG": "",
        "GROUPBUY_KEY": "dev-x",
        "GROUPBUY_TEST_REDIS_URL": "redis://127.0.0.1:6379/15",
        "GROUPBUY_EMBEDDED_BINARY": "valkey-server",
        "HOME": "/root",
    }
    with caplog.at_level(logging.WARNING, logger="groupbuy.settings"):
        settings = load_settings(None, environ)
    assert settings.server.port == 9000
    assert [r.getMessage() for r in caplog.records] == [
        "unknown environment variable GROUPBUY_NOTHING_LIKE_IT is ignored",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("GROUPBUY_REDIS_ULR", "GROUPBUY_REDIS_URL"),
        ("GROUPBUY_API_KEY", "GROUPBUY_API_KEYS"),
        ("GROUPBUY_DATABSE_URL", "GROUPBUY_DATABASE_URL"),
        ("GROUPBUY_LOG_FROMAT", "GROUPBUY_LOG_FORMAT"),
    ],
)
def test_a_misspelt_variable_is_refused_naming_the_one_it_resembles(
    variable: str, meant: str
) -> None:
    """Warned and ignored, GROUPBUY_REDIS_ULR would run the service on the embedded engine
    while the operator believes it uses their Redis."""
    with pytest.raises(SettingsError) as raised:
        load_settings(None, {variable: "redis://127.0.0.1:6379/0", "GROUPBUY_NOTHING_ELSE": "1"})
    assert str(raised.value) == f"unknown environment variable {variable} (did you mean {meant}?)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nprot = 1\n", "unknown key(s) in [server]: prot (did you mean port?)"),
        ("[redis]\nulr = 'x'\n", "unknown key(s) in [redis]: ulr (did you mean url?)"),
        ("[log]\nlevl = 'info'\n", "unknown key(s) in [log]: levl (did you mean level?)"),
        ("[servr]\nport = 1\n", "unknown section(s) in {config}: servr (did you mean [server]?)"),
        ("[server]\nzzzzz = 1\n", "unknown key(s) in [server]: zzzzz"),
    ],
)
def test_an_unknown_key_in_the_file_gets_a_did_you_mean(
    tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text)
    with pytest.raises(SettingsError) as raised:
        load_settings(config, {})
    assert str(raised.value) == message.format(config=config)


def test_a_removed_setting_is_refused_saying_it_was_removed(tmp_path: Path) -> None:
    """config.toml shipped `local_share = 0.01`: a copy of it must say what to do, not
    only that the key is unknown."""
    config = tmp_path / "c.toml"
    config.write_text("[ratelimit]\nenabled = true\nlocal_share = 0.01\n")
    why = "every rate limit is decided in Redis, exactly"
    with pytest.raises(SettingsError) as raised:
        load_settings(config, {})
    assert str(raised.value) == (
        f"[ratelimit] local_share was removed: {why} "
        "(docs/decisions/0009-rate-limits-decided-in-redis-only.md); delete the line"
    )
    with pytest.raises(SettingsError) as raised:
        load_settings(None, {"GROUPBUY_RATELIMIT_LOCAL_SHARE": "0"})
    assert str(raised.value).startswith(
        f"GROUPBUY_RATELIMIT_LOCAL_SHARE: [ratelimit] local_share was removed: {why} "
    )
    assert str(raised.value).endswith("; unset it")
    assert (ROOT / "docs/decisions/0009-rate-limits-decided-in-redis-only.md").is_file()


def test_the_log_section_and_its_variables() -> None:
    assert load_settings(None, {}).log == LogSettings(level="info", access_log=True, format="text")
    given = load_settings(
        None,
        {
            "GROUPBUY_LOG_LEVEL": "warning",
            "GROUPBUY_LOG_ACCESS_LOG": "false",
            "GROUPBUY_LOG_FORMAT": "json",
        },
    ).log
    assert (given.level, given.access_log, given.format) == ("warning", False, "json")
    with pytest.raises(SettingsError, match=re.escape("GROUPBUY_LOG_FORMAT: [log] format")):
        load_settings(None, {"GROUPBUY_LOG_FORMAT": "xml"})


@pytest.mark.parametrize(("word", "expected"), [("yes", True), ("on", True), ("0", False)])
def test_booleans_from_the_environment(word: str, expected: bool) -> None:
    assert load_settings(None, {"GROUPBUY_SCHEDULER_ENABLED": word}).scheduler.enabled is expected


def test_settings_are_immutable_and_replace_checks_again() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.server.port = 1
    assert settings.replace("server", port=9000).server.port == 9000
    assert settings.server.port == 8000
    with pytest.raises(SettingsError, match=re.escape("[server] port")):
        settings.replace("server", port=70000)


@pytest.mark.parametrize(
    ("section", "name", "model", "field", "bad"),
    [
        ("teams", "team_size", ActivityCreate, "team_size", 51),
        ("teams", "lock_ttl_s", ActivityCreate, "lock_ttl_s", 0),
        ("redpackets", "max_count", PacketSend, "count", 100_001),
        ("redpackets", "max_amount_cents", Deposit, "amount_cents", 10**12 + 1),
        ("redpackets", "expires_in_s", PacketSend, "expires_in_s", 604_801),
    ],
)
def test_a_bound_shared_with_a_request_refuses_the_same_value_in_both(
    section: str, name: str, model: type[BaseModel], field: str, bad: int
) -> None:
    with pytest.raises(SettingsError, match=re.escape(f"[{section}] {name}")):
        load_settings(None, {f"GROUPBUY_{section.upper()}_{name.upper()}": str(bad)})
    good = {
        "activity_id": "a",
        "sender_id": "s",
        "amount_cents": 100,
        "count": 1,
        "reference": "r",
    }
    body = {k: v for k, v in good.items() if k in model.model_fields} | {field: bad}
    with pytest.raises(ValidationError):
        model.model_validate(body)
    model.model_validate({**body, field: bad - 1 if bad > 1 else 1})


def test_a_file_that_is_not_toml_is_refused_with_a_message(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server\nport = 1\n")
    with pytest.raises(SettingsError, match="is not valid TOML"):
        load_settings(config, {})


def test_every_groupbuy_variable_the_project_reads_is_known() -> None:
    """A variable read somewhere in the package, the tests or the scripts is a setting or
    a listed non-setting, so setting it never draws the unknown-variable warning."""
    used: set[str] = set()
    for folder in ("groupbuy", "tests", "scripts", "benchmarks"):
        for file in (ROOT / folder).rglob("*"):
            # this file names misspelt variables on purpose
            if (
                file.suffix in {".py", ".sh"}
                and file.is_file()
                and file.name != Path(__file__).name
            ):
                used.update(re.findall(r"\bGROUPBUY_[A-Z0-9_]+", file.read_text()))
    known = {
        f"GROUPBUY_{section.upper()}_{name.upper()}"
        for section, info in Settings.model_fields.items()
        for name in typing.cast(type[BaseModel], info.annotation).model_fields
    }
    known |= set(ENV_ALIASES) | set(NON_SETTING_VARIABLES)
    used.discard("GROUPBUY_REDIS_ULR")  # test_cli.py starts a service with it: refused
    unknown = {
        v
        for v in used
        if v not in known and not v.endswith("_") and not v.startswith(NON_SETTING_PREFIXES)
    }
    assert unknown == set()


def test_an_empty_api_keys_variable_means_no_keys() -> None:
    assert load_settings(None, {"GROUPBUY_API_KEYS": ""}).auth.keys == ()


@pytest.mark.parametrize("url", ["127.0.0.1:6379", "localhost", "http://127.0.0.1:6379/0"])
def test_a_redis_url_without_its_scheme_is_refused_with_the_expected_form(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(None, {"GROUPBUY_REDIS_URL": url})
    message = str(refused.value)
    assert message.startswith(
        "GROUPBUY_REDIS_URL: [redis] url: must be a Redis URL such as redis://host:port/db, "
        "rediss://host:port/db (TLS) or unix:///path/to/redis.sock, got "
    )
    assert message.endswith(repr(url))
    # The command says it in one line and exits 2, like every configuration error.
    monkeypatch.setenv("GROUPBUY_REDIS_URL", url)
    monkeypatch.setenv("GROUPBUY_CONFIG", str(ROOT / "config.toml"))
    assert main(["worker"]) == 2
    assert capsys.readouterr().err == f"groupbuy: {message}\n"


@pytest.mark.parametrize("url", ["redis://h:1/0", "rediss://u:p@h:1/2", "unix:///run/r.sock"])
def test_redis_urls_with_a_scheme_are_taken(url: str) -> None:
    assert load_settings(None, {"GROUPBUY_REDIS_URL": url}).redis.url == url


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"GROUPBUY_REDIS_SENTINEL": "10.0.0.1:26379,10.0.0.2"},
            "GROUPBUY_REDIS_SENTINEL: [redis] sentinel: must list the Sentinels as "
            "host:port,host:port, got '10.0.0.2' in '10.0.0.1:26379,10.0.0.2'",
        ),
        (
            {"GROUPBUY_REDIS_SENTINEL": "h:1", "GROUPBUY_REDIS_CLUSTER": "true"},
            "[redis]: sentinel and cluster = true exclude each other: choose one",
        ),
        (
            {"GROUPBUY_REDIS_WAIT_REPLICAS": "1"},
            "[redis]: wait_replicas needs a Redis with replicas (set url or sentinel); the "
            "embedded engine has none",
        ),
        (
            {
                "GROUPBUY_REDIS_URL": "redis://node1:7000/0",
                "GROUPBUY_REDIS_CLUSTER": "true",
                "GROUPBUY_REDIS_WAIT_REPLICAS": "1",
            },
            "[redis]: wait_replicas is not supported with cluster = true: a call's WAIT must "
            "go to the primary that ran it, on the same connection, and cluster mode does not "
            "do that yet",
        ),
    ],
)
def test_sentinel_and_wait_replicas_settings_that_cannot_work_are_refused_in_one_line(
    variables: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(None, variables)
    assert str(refused.value) == message


def test_sentinels_alone_select_a_real_redis_rather_than_the_embedded_engine() -> None:
    settings = load_settings(
        None, {"GROUPBUY_REDIS_SENTINEL": "s1:26379, s2:26380", "GROUPBUY_REDIS_WAIT_REPLICAS": "1"}
    )
    assert not settings.redis.embedded
    assert settings.redis.sentinel_addresses == [("s1", 26379), ("s2", 26380)]
    assert settings.redis.wait_replicas == 1
