#!/usr/bin/env bash
# Run the demo on the embedded default (in-process fakeredis; no Redis server, no API key).
source "$(dirname "$0")/_venv.sh"
exec .venv/bin/wakeful demo "$@"
