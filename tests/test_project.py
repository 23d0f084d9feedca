"""The project's habits: the version written once, the license, the changelog's form, and
pre-commit hooks that run the test command's checks."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

import groupbuy

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# Keep a Changelog 1.1.0's kinds of change.
CHANGE_KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def hooks() -> dict[str, dict[str, Any]]:
    """The hooks of .pre-commit-config.yaml by id."""
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_the_version_is_written_once_in_the_package() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"] == {"path": "groupbuy/__init__.py"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", groupbuy.__version__)
    assert importlib.metadata.version("groupbuy") == groupbuy.__version__


def test_the_license_is_mit_and_declared() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert re.search(r"^Copyright \(c\) \d{4} the groupbuy authors$", text, re.MULTILINE)
    assert PYPROJECT["project"]["license"] == "MIT"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]


def test_the_changelog_keeps_a_changelog_form_and_names_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.MULTILINE)
    assert releases[0] == ("Unreleased", "")
    for version, date in releases[1:]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        assert re.fullmatch(r" - \d{4}-\d\d-\d\d", date), date
    assert groupbuy.__version__ in [version for version, _ in releases]
    kinds = set(re.findall(r"^### (.+)$", text, re.MULTILINE))
    assert kinds and kinds <= CHANGE_KINDS, kinds


def test_pre_commit_runs_the_checks_of_the_test_command() -> None:
    checked = re.search(r"^CHECKED=\((.+)\)$", (ROOT / "scripts/test.sh").read_text(), re.M)
    assert checked, "scripts/test.sh names the checked folders in CHECKED=(...)"
    folders = checked[1].split()
    found = hooks()
    assert found["ruff-check"]["entry"].startswith(".venv/bin/ruff check")
    assert found["ruff-format"]["entry"].startswith(".venv/bin/ruff format")
    assert found["mypy"]["entry"].split() == [".venv/bin/mypy", *folders]
    assert found["mypy"]["pass_filenames"] is False
    for name in ("ruff-check", "ruff-format"):
        assert found[name]["files"] == f"^({'|'.join(folders)})/"
    valid = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert valid.returncode == 0, valid.stdout + valid.stderr


def test_the_commit_message_hook_refuses_a_subject_of_72_characters(tmp_path: Path) -> None:
    hook = hooks()["commit-subject-length"]
    assert hook["language"] == "pygrep" and hook["stages"] == ["commit-msg"]

    def passes(message: str) -> bool:
        # What pre-commit runs for a pygrep hook (no stash of the work tree on the way).
        path = tmp_path / "COMMIT_EDITMSG"
        path.write_text(message)
        command = [sys.executable, "-m", "pre_commit.languages.pygrep", *hook["args"]]
        done = subprocess.run([*command, hook["entry"], str(path)], capture_output=True)
        assert done.returncode in (0, 1), done.stderr
        return done.returncode == 0

    assert passes("x" * 71 + "\n\n" + "the detail, as long as it needs " * 5 + "\n")
    assert not passes("x" * 72 + "\n")
    assert not passes("x" * 80 + "\n\nbody\n")
    assert passes("Short subject\n")
