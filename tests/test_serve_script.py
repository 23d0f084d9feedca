"""./scripts/serve.sh: one line per install step and pip's output in a log (shown when pip
fails); on a system Python without venv, the one command that fixes it, and nothing half
made; a development run without access lines unless asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.http import SERVICE
from tests.support.servers import free_port
from tests.support.service import Service, service_environment

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_TIMEOUT_S = 60  # a run of the script against fakes: seconds at most
READY_S = 90  # a real start on a busy 2-core machine (tests/support/service.py says why)
POLL_S = 0.05  # between readiness probes of a starting service
# Variables that say whether access lines are wanted: a test sets them or leaves them out.
OWN_CHOICES = {"GROUPBUY_CONFIG", "GROUPBUY_LOG_ACCESS_LOG"}

# What pip prints while it works: none of it may reach the terminal.
PIP_CHATTER = ("Collecting groupbuy-client", "Requirement already satisfied: pip")
# A `.venv/bin/python` that stands for pip: it logs its arguments, chatters, and its
# install of the package makes a `groupbuy` that prints what serve.sh handed it.
FAKE_PIP = f"""#!/bin/sh
echo "$*" >> .venv/pip-calls
printf '%s\\n' "{PIP_CHATTER[0]}" "{PIP_CHATTER[1]}"
case "$*" in *"-e ."*)
  printf '#!/bin/sh\\necho "access_log=${{GROUPBUY_LOG_ACCESS_LOG-unset}} args=$*"\\n' \\
    > .venv/bin/groupbuy
  chmod +x .venv/bin/groupbuy;;
esac
"""
FAILING_PIP = """#!/bin/sh
echo "ERROR: No matching distribution found for aiosqlite" >&2
exit 1
"""


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


def venv_making_python(tmp_path: Path, pip: str) -> Path:
    """A `python3` whose `-m venv .venv` makes a venv whose python is `pip` (a script)."""
    (tmp_path / "pip.sh").write_text(pip)
    return fake_python(
        tmp_path,
        'case "$1" in -c) exit 0;; -m) mkdir -p .venv/bin; cp pip.sh .venv/bin/python; '
        "chmod +x .venv/bin/python;; esac",
    )


def outside() -> dict[str, str]:
    """The test runner's environment without the variables whose absence the script reads."""
    return {k: v for k, v in os.environ.items() if k not in OWN_CHOICES}


def run(tmp_path: Path, python: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script, run to its end with this `python3`."""
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "serve.sh"), *args],
        env={**outside(), "PYTHON": str(python), **env},
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )


def test_a_python_without_venv_gets_the_apt_command(tmp_path: Path) -> None:
    """Debian's python3 without python3-venv: `import ensurepip` fails."""
    python = fake_python(tmp_path, "exit 1")
    done = run(checkout(tmp_path), python)
    assert done.returncode == 1, done
    assert "sudo apt-get install python3-venv" in done.stderr, done.stderr
    assert not (tmp_path / ".venv").exists()


def test_a_failing_venv_is_removed_and_explained(tmp_path: Path) -> None:
    """The modules import, but making the environment fails halfway (ensurepip's step)."""
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


def test_a_first_run_says_each_step_in_a_line_and_keeps_pips_output_in_its_log(
    tmp_path: Path,
) -> None:
    """No pip chatter on the terminal; the server and its client installed in one pip call;
    `groupbuy serve` started with access lines off and the arguments passed on."""
    done = run(checkout(tmp_path), venv_making_python(tmp_path, FAKE_PIP), "--port", "9000")
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines[:3]] == [
        "serve.sh: making .venv with Python 3.11.2",
        "serve.sh: updating pip",
        "serve.sh: installing groupbuy, its client and their dependencies",
    ]
    assert lines[3].startswith("serve.sh: installed in "), lines
    assert lines[4:] == ["access_log=false args=serve --port 9000"], lines
    assert not any(chatter in done.stdout + done.stderr for chatter in PIP_CHATTER), done
    calls = (tmp_path / ".venv" / "pip-calls").read_text().splitlines()
    assert [call.split(" install ")[1] for call in calls] == ["--upgrade pip", "-e ./client -e ."]
    assert PIP_CHATTER[0] in (tmp_path / ".venv" / "pip-install.log").read_text()
    assert (tmp_path / ".venv" / ".groupbuy-installed").exists()


@pytest.mark.parametrize(
    ("args", "env", "seen"),
    [
        ((), {"GROUPBUY_LOG_ACCESS_LOG": "true"}, "access_log=true args=serve"),
        ((), {"GROUPBUY_CONFIG": "mine.toml"}, "access_log=unset args=serve"),
        (("--config", "mine.toml"), {}, "access_log=unset args=serve --config mine.toml"),
    ],
)
def test_access_lines_are_left_to_a_variable_or_config_file_of_your_own(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], seen: str
) -> None:
    """Only a run that says nothing about access lines gets them turned off."""
    python = venv_making_python(tmp_path, FAKE_PIP)
    done = run(checkout(tmp_path), python, *args, **env)
    assert done.returncode == 0, done
    assert done.stdout.splitlines()[-1] == seen


def test_a_failing_pip_shows_the_end_of_its_log(tmp_path: Path) -> None:
    """pip's error reaches the terminal, and the next run installs again."""
    done = run(checkout(tmp_path), venv_making_python(tmp_path, FAILING_PIP))
    assert done.returncode == 1, done
    assert "pip failed; the end of its log (.venv/pip-install.log)" in done.stderr
    assert "No matching distribution found for aiosqlite" in done.stderr, done.stderr
    assert not (tmp_path / ".venv" / ".groupbuy-installed").exists()


def serve(directory: Path, **env: str) -> Service:
    """serve.sh in a checkout whose .venv is this one's, installed: `groupbuy serve` for
    real, on a free port, its output in a file; returned once /healthz answers."""
    checkout(directory)
    os.utime(directory / "pyproject.toml", (0, 0))  # older than the install's mark
    (directory / ".venv" / "bin").mkdir(parents=True)
    (directory / ".venv" / "bin" / "groupbuy").symlink_to(ROOT / ".venv" / "bin" / "groupbuy")
    (directory / ".venv" / ".groupbuy-installed").touch()
    variables = service_environment(directory, **env)
    for unset in {"GROUPBUY_CONFIG", "GROUPBUY_LOG_ACCESS_LOG"} - set(env):
        variables.pop(unset, None)  # the run's own choice, not the test runner's
    port = free_port()
    output = directory / "serve.log"
    with output.open("wb") as out:
        process = subprocess.Popen(
            ["bash", str(directory / "scripts" / "serve.sh"), "--port", str(port)],
            cwd=directory,
            env=variables,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    service = Service(f"http://127.0.0.1:{port}", process, output)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        assert process.poll() is None, service.text()
        try:
            if httpx.get(f"{service.url}/healthz", timeout=1).status_code == 200:
                return service
        except httpx.HTTPError:
            time.sleep(POLL_S)
    service.stop(timeout_s=1)
    raise AssertionError(f"serve.sh did not answer in {READY_S} s:\n{service.text()}")


@pytest.mark.parametrize(
    ("env", "logged"), [({}, False), ({"GROUPBUY_LOG_ACCESS_LOG": "true"}, True)]
)
def test_a_development_run_prints_no_access_line_unless_asked(
    tmp_path: Path, env: dict[str, str], logged: bool
) -> None:
    """A real `groupbuy serve` through the script: requests answered, and an access line for
    each only with GROUPBUY_LOG_ACCESS_LOG=true (the check finds them when they are there)."""
    service = serve(tmp_path, **env)
    try:
        missing = httpx.get(f"{service.url}/v1/activities/nope", headers=SERVICE, timeout=30)
        assert missing.status_code == 404, missing.text
    finally:
        assert service.stop() == 0, service.text()
    text = service.text()
    assert ("groupbuy.access" in text) is logged, text
    assert "listening on" in text, text  # the start-up lines stay
