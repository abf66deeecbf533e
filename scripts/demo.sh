#!/usr/bin/env bash
# Run the demo: no Redis server and no API key needed. It serves the embedded Redis
# (a fakeredis) from its own process to the worker processes it starts and kills.
HERE="$PWD"
source "$(dirname "$0")/_venv.sh"  # installs .venv on first use; cds to the checkout
cd "$HERE"  # the commands the demo prints at the end are relative to where you are
exec "$ROOT/.venv/bin/wakeful" demo "$@"
