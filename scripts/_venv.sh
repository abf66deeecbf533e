# Sourced by the other scripts: make .venv with the project installed, from a fresh clone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
EXTRA="${1:-}"
STAMP=".venv/.installed${EXTRA:+-$EXTRA}"
needs_install() { [ ! -x .venv/bin/python ] || [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; }
if needs_install; then
  # Two runs sharing this checkout install one at a time: the second waits on the lock
  # (up to 10 min) and then finds the stamp fresh instead of racing pip.
  exec 9>".venv.lock"
  if command -v flock >/dev/null 2>&1; then
    flock -w 600 9 || { echo "another install holds .venv.lock for over 10 minutes"; exit 1; }
  fi
  if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
  fi
  if needs_install; then
    echo "Installing Wakeful${EXTRA:+[$EXTRA]} into .venv (first run: a minute or two) ..." >&2
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".${EXTRA:+[$EXTRA]}"
    touch "$STAMP"
  fi
  exec 9>&-
fi
