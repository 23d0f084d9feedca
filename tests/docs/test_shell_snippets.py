"""The docs' shell snippets run as written against a live `groupbuy serve`: the curl
walk-through and the Python one in either order, the signed request twice in a row, and
every other group marked in README.md or docs/ (the README's `taste` blocks among them).

A fenced ```sh block right after `<!-- snippet: <group> -->` is a snippet; tests/support/
snippets.py collects and runs them (each group in one `bash -euo pipefail`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from groupbuy import __version__
from tests.support import snippets
from tests.support.service import Service, service_environment, start_service
from tests.support.snippets import GETTING_STARTED, Snippet

# The groups of docs/getting-started.md, each run by a test of its own below.
WALK_THROUGHS = tuple(("docs/getting-started.md", name) for name in ("curl", "signed", "restart"))
SALE = "SALE=curl-sale"  # the curl walk-through's activity, as its first block names it
OTHER_GROUPS = [key for key in snippets.groups(snippets.doc_files()) if key not in WALK_THROUGHS]


def page_group(name: str) -> list[Snippet]:
    """The snippets of docs/getting-started.md in group `name`."""
    return snippets.groups([GETTING_STARTED])[("docs/getting-started.md", name)]


def serve_as_the_readme(directory: Path) -> Service:
    """`groupbuy serve` as the README starts it: the embedded engine, no API keys (so a
    development admin key in groupbuy-data/), its files in `directory`, the snippets' cwd."""
    data = str(directory / "groupbuy-data")
    env = service_environment(directory, GROUPBUY_EMBEDDED_DATA_DIR=data)
    del env["GROUPBUY_API_KEYS"]
    return start_service(directory, env=env)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    """A service started as the README starts it, stopped at the end."""
    running = serve_as_the_readme(tmp_path)
    try:
        yield running
    finally:
        assert running.stop() == 0, running.text()


def exported(service: Service) -> dict[str, str]:
    """What the page tells the reader to export, for this service: its URL, and the key its
    start-up lines print (the same one groupbuy-data/dev-admin-key keeps)."""
    lines = service.text().splitlines()
    printed = [line.split("=", 1)[1] for line in lines if "export GROUPBUY_KEY=" in line]
    key_file = Path(service.output).parent / "groupbuy-data" / "dev-admin-key"
    assert printed == [key_file.read_text().strip()], service.text()
    return {"URL": service.url, "GROUPBUY_KEY": printed[0]}


def run_curl_walk_through(service: Service) -> None:
    """The curl walk-through, its answers checked against the ones the page shows."""
    group = page_group("curl")
    outputs = snippets.run_group(group, exported(service), service.output.parent)
    snippets.check_group(group, outputs)


def run_walk_py(service: Service, *args: str) -> subprocess.CompletedProcess[str]:
    """walk.py, saved from the page into the service's directory, run as the page says."""
    code, _ = snippets.python_walk_through()
    (service.output.parent / "walk.py").write_text(code)
    return subprocess.run(
        [sys.executable, "walk.py", *args],
        cwd=service.output.parent,
        env={**os.environ, **exported(service)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_python_walk_through(service: Service) -> None:
    """walk.py, its output checked against the one the page shows (times, ids aside)."""
    walk = run_walk_py(service)
    assert walk.returncode == 0, walk.stderr
    _, shown = snippets.python_walk_through()
    assert snippets.without_varying(walk.stdout) == snippets.without_varying(shown)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("curl_first", [True, False], ids=["curl-then-python", "python-then-curl"])
def test_both_walk_throughs_run_in_either_order(service: Service, curl_first: bool) -> None:
    steps = [run_curl_walk_through, run_python_walk_through]
    for step in steps if curl_first else steps[::-1]:
        step(service)


@pytest.mark.real
@pytest.mark.slow
def test_a_second_run_answers_what_the_page_says(service: Service) -> None:
    run_curl_walk_through(service)
    run_python_walk_through(service)
    # curl: step 2 answers 409 activity_closed (step 9 closed the sale) and the run stops.
    again = snippets.run_script(page_group("curl"), exported(service), service.output.parent)
    assert again.returncode == 22, again.stdout + again.stderr
    assert '"code":"activity_closed"' in again.stdout, again.stdout
    # ... and runs through with another activity.
    renamed = [
        replace(s, block=replace(s.block, text=s.block.text.replace(f"{SALE} ", f"{SALE}-2 ")))
        for s in page_group("curl")
    ]
    assert sum(f"{SALE}-2 " in s.block.text for s in renamed) == 1
    snippets.check_group(
        renamed, snippets.run_group(renamed, exported(service), service.output.parent)
    )
    # walk.py: bob's lock answers 409 already_member; with another activity it runs through.
    second = run_walk_py(service)
    assert second.returncode == 1 and "409 already_member" in second.stderr, second.stderr
    other = run_walk_py(service, "py-sale-2")
    assert other.returncode == 0, other.stderr
    assert "carol holds a seat in py-team-1" in other.stdout


@pytest.mark.real
@pytest.mark.slow
def test_a_restart_prints_the_same_key_and_keeps_what_the_walk_throughs_did(
    tmp_path: Path,
) -> None:
    first = serve_as_the_readme(tmp_path)
    try:
        run_python_walk_through(first)
        run_curl_walk_through(first)
        key = exported(first)["GROUPBUY_KEY"]
    finally:
        assert first.stop() == 0, first.text()
    assert f"groupbuy {__version__} stopped" in first.text()
    second = serve_as_the_readme(tmp_path)
    try:
        assert exported(second)["GROUPBUY_KEY"] == key
        group = page_group("restart")
        outputs = snippets.run_group(group, exported(second), tmp_path)
        snippets.check_group(group, outputs)
        team, packet = (next(snippets.json_values(output)) for output in outputs)
        assert isinstance(team, dict) and isinstance(packet, dict)
        assert [member["user_id"] for member in team["members"]] == ["amy", "ben"]
        assert [grab["user_id"] for grab in packet["grabs"]] == ["bob"]
    finally:
        assert second.stop() == 0, second.text()


@pytest.mark.real
@pytest.mark.slow
def test_the_signed_request_runs_twice_in_a_row(service: Service) -> None:
    group = page_group("signed")
    for _ in range(2):  # back to back, within a second or two: a fresh body each time
        outputs = snippets.run_group(group, exported(service), service.output.parent)
        snippets.check_group(group, outputs)
        assert '"reason":"replayed"' in outputs[1], outputs


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("key", OTHER_GROUPS, ids=["/".join(key) for key in OTHER_GROUPS])
def test_every_other_snippet_group_runs(service: Service, key: tuple[str, str]) -> None:
    group = snippets.groups(snippets.doc_files())[key]
    snippets.check_group(group, snippets.run_group(group, exported(service), service.output.parent))


def test_every_marker_stands_before_an_sh_block() -> None:
    problems = [p for path in snippets.doc_files() for p in snippets.misplaced_markers(path)]
    assert problems == [], "\n".join(problems)


def test_a_marker_before_another_block_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- snippet: taste -->\n```bash\necho hi\n```\n\n"
        "<!-- snippet: taste -->\n\n```sh\necho hi\n```\n"
        "<!-- snippet: taste -->\n```sh\necho fine\n```\n"
    )
    assert snippets.misplaced_markers(page) == [
        f"{page}:1: marker before '```bash'",
        f"{page}:6: marker before ''",
    ]
    assert [s.block.text for s in snippets.snippets(page)] == ["echo fine"]


def test_groups_are_collected_per_file_in_order_with_their_shown_answers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- snippet: taste -->\n```sh\ncurl -sf $URL/healthz\n```\n\n"
        '```json\n{"status": "ok"}\n```\n\n'
        "```sh\necho not marked\n```\n"
        "<!-- snippet: other -->\n```sh\necho b\n```\n\ntext\n\n```json\n{}\n```\n"
        "<!-- snippet: taste -->\n```sh\ncurl -s $URL/nothing\n```\n"
    )
    found = snippets.groups([readme])
    assert list(found) == [(str(readme), "taste"), (str(readme), "other")]
    taste = found[(str(readme), "taste")]
    assert [(s.block.text, s.shown) for s in taste] == [
        ("curl -sf $URL/healthz", '{"status": "ok"}'),
        ("curl -s $URL/nothing", None),
    ]
    assert found[(str(readme), "other")][0].shown is None  # prose between: not its answer
    with pytest.raises(AssertionError, match="curl without --fail-with-body"):
        snippets.check_group(taste, ['{"status": "ok"}', "{}"])


def test_a_shown_answer_is_checked_against_the_real_one() -> None:
    shown = '{"status": 409, "code": "team_full", "next_unlock_at": "2026-01-01T00:00:00Z"}'
    assert snippets.shows_error(shown)
    same = '{"status": 409, "code": "team_full", "next_unlock_at": "2027-02-02T00:00:00Z"}'
    assert snippets.answer_mismatches(shown, same) == []
    other = '{"status": 409, "code": "lock_required", "next_unlock_at": null}'
    assert snippets.answer_mismatches(shown, other) == [
        "code: shown 'team_full', answered 'lock_required'"
    ]
    assert snippets.answer_mismatches('{"a": 1}', '{"b": 1}') == [
        "shown keys ['a'], answered {'b': 1}"
    ]
    assert snippets.answer_mismatches("{}", "{} {}")[0].startswith("2 JSON values answered")
    assert snippets.answer_mismatches("{}", "<html>")[0].startswith("not JSON")
    assert not snippets.fails_on_http_errors('curl -s -H "$AUTH" $URL')
    assert snippets.fails_on_http_errors("curl -sf $URL")
    assert snippets.fails_on_http_errors("curl -s --fail-with-body $URL")
