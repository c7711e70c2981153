#!/bin/bash
# down.sh RUN: stop exactly the processes up.sh started for this run (by recorded PID) and remove RUN.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RUN=${1:?usage: down.sh RUN}
[ -d "$RUN" ] || exit 0
"$HERE/apiserver.sh" "$RUN" stop 2>/dev/null || true
PGDIR=$(cat "$RUN/pg.dir" 2>/dev/null || true)
if [ -n "$PGDIR" ] && [ -f "$RUN/pg.bin" ] && [ -f "$PGDIR/pg/data/postmaster.pid" ]; then
  su postgres -s /bin/sh -c "$(cat "$RUN/pg.bin")/pg_ctl -D $PGDIR/pg/data -m immediate -w stop" >/dev/null 2>&1 || true
fi
if [ -f "$RUN/pids" ]; then
  while read -r name pid; do
    kill "$pid" 2>/dev/null || true
  done < "$RUN/pids"
  while read -r name pid; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done < "$RUN/pids"
fi
case "$PGDIR" in /tmp/sr-cp-testenv-pg.*) rm -rf "$PGDIR" ;; esac
case "$RUN" in /tmp/sr-cp-testenv.*) rm -rf "$RUN" ;; esac
