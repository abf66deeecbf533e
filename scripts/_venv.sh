# Sourced by the other scripts: make .venv with the project installed, from a fresh clone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
EXTRA="${1:-}"
STAMP=".venv/.installed${EXTRA:+-$EXTRA}"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".${EXTRA:+[$EXTRA]}"
  touch "$STAMP"
fi
