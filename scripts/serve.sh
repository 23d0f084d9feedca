#!/usr/bin/env bash
# Run the service on the embedded default (in-process fakeredis + a SQLite file): nothing to install
# but Python. Extra arguments go to `groupbuy serve` (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/groupbuy ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e .
fi
exec .venv/bin/groupbuy serve "$@"
