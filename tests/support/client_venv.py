"""The virtualenv holding groupbuy-client alone (.venv-client, made by scripts/test.sh)."""

from __future__ import annotations

from pathlib import Path

from tests.support.starting import started_or_skip

REPO = Path(__file__).resolve().parents[2]
CLIENT_PYTHON = REPO / ".venv-client" / "bin" / "python"
MISSING = "no .venv-client here: scripts/test.sh makes it (groupbuy-client installed alone)"


def client_python() -> Path:
    """The clean virtualenv's python; the test skips where it was not made, except in CI."""

    def found() -> Path:
        if not CLIENT_PYTHON.is_file():
            raise FileNotFoundError(CLIENT_PYTHON)
        return CLIENT_PYTHON

    return started_or_skip(found, MISSING)
