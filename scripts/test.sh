#!/usr/bin/env bash
# Run the lint, the type check, the import layers and the whole test suite, on fakeredis and on a real Redis.
# Starts a Redis on 127.0.0.1:6379 if none answers there (installing it if needed).
# The cluster tests (tests/test_cluster.py, marked `cluster`) start local Redis Clusters of their own.
#   scripts/test.sh --cluster [pytest args]   runs the Redis-backed subset below on the
#   cluster backend too (a local 3-master, 3-replica cluster; about two to three minutes).
CLUSTER_SUBSET=(tests/test_cluster.py tests/test_leases.py tests/test_stall_guard.py tests/test_wake_pointers.py
  tests/test_scripts.py tests/test_delivery.py tests/test_bad_items.py tests/test_commit_points.py
  tests/test_retention.py tests/test_schedules.py)
source "$(dirname "$0")/_venv.sh" test

# Another install holding the package manager's lock: wait for it (10 min) instead of failing.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }

redis_up() {
  .venv/bin/python -c "import redis,sys; sys.exit(0 if redis.Redis(socket_connect_timeout=1).ping() else 1)" 2>/dev/null
}
if ! redis_up; then
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "installing redis-server (Debian package)"
    (apt_get update -qq && apt_get install -y -qq redis-server) >/dev/null
  fi
  echo "starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --logfile /tmp/wakeful-test-redis.log
  for _ in $(seq 50); do redis_up && break; sleep 0.1; done
  redis_up || { echo "redis-server did not start; see /tmp/wakeful-test-redis.log"; exit 1; }
fi

# The web console's tests drive Debian's Chromium (no browser download).
if [ ! -x "${WAKEFUL_CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "installing chromium (Debian package) for the browser tests"
  (apt_get update -qq && DEBIAN_FRONTEND=noninteractive apt_get install -y -qq chromium) >/dev/null
fi

.venv/bin/ruff check .
.venv/bin/ruff format --check --quiet .
# mypy and the import layers, on the package as it installs (wakeful.*).
.venv/bin/python scripts/check_types.py
if [ "${1:-}" = "--cluster" ]; then
  shift
  WAKEFUL_TEST_CLUSTER=1 exec .venv/bin/python -m pytest -k "cluster" "${CLUSTER_SUBSET[@]}" "$@"
fi
exec .venv/bin/python -m pytest "$@"
