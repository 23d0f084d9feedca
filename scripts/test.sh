#!/usr/bin/env bash
# The whole check on a fresh machine: virtualenv, dependencies, redis-server, then the
# linters, the type checker and pytest. Extra arguments go to pytest.
# The tests start (and stop) their own redis-server on a free loopback port.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server from Debian's packages"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
echo "== installing groupbuy with its test and dev tools (versions pinned in pyproject.toml)"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test,postgres,dev]'

CHECKED=(groupbuy tests benchmarks)
echo "== ruff check"
.venv/bin/ruff check "${CHECKED[@]}"
echo "== ruff format --check"
.venv/bin/ruff format --check "${CHECKED[@]}"
echo "== mypy (strict)"
.venv/bin/mypy "${CHECKED[@]}"

echo "== pytest"
exec .venv/bin/python -m pytest "$@"
