"""./scripts/serve.sh: pip's progress shown; on a system Python without venv, the one command
that fixes it, and nothing half made."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def checkout(tmp_path: Path) -> Path:
    """A copy of the script in a checkout of its own (it works from the script's parent)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "serve.sh", tmp_path / "scripts" / "serve.sh")
    (tmp_path / "pyproject.toml").write_text("")
    return tmp_path


def fake_python(tmp_path: Path, body: str) -> Path:
    """A `python3` that answers --version and runs `body` (a shell case) for the rest."""
    path = tmp_path / "python3"
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Python 3.11.2"; exit 0; fi\n{body}\n'
    )
    path.chmod(0o755)
    return path


def run(tmp_path: Path, python: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "serve.sh")],
        env={**os.environ, "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_python_without_venv_gets_the_apt_command(tmp_path: Path) -> None:
    # Debian's python3 without python3-venv: `import ensurepip` fails.
    python = fake_python(tmp_path, "exit 1")
    done = run(checkout(tmp_path), python)
    assert done.returncode == 1, done
    assert "sudo apt-get install python3-venv" in done.stderr, done.stderr
    assert not (tmp_path / ".venv").exists()


def test_a_failing_venv_is_removed_and_explained(tmp_path: Path) -> None:
    # The modules import, but making the environment fails halfway (ensurepip's step).
    python = fake_python(
        tmp_path,
        'case "$1" in -c) exit 0;; -m) mkdir -p .venv/bin; echo "ensurepip failed" >&2; '
        "exit 1;; esac",
    )
    done = run(checkout(tmp_path), python)
    assert done.returncode == 1, done
    assert "making .venv with Python 3.11.2" in done.stdout
    assert "apt-get install python3-venv" in done.stderr, done.stderr
    assert not (tmp_path / ".venv").exists()


def test_the_install_shows_pip_progress_rather_than_silence() -> None:
    """pip runs without -q and with its progress bar: a slow network shows something."""
    script = (ROOT / "scripts" / "serve.sh").read_text()
    installs = [line for line in script.splitlines() if "pip install" in line]
    assert len(installs) == 2, installs
    for line in installs:
        assert "-q" not in line.split() and ">/dev/null" not in line, line
        assert "--progress-bar on" in line, line
