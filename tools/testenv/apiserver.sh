#!/bin/bash
# apiserver.sh RUN start|stop: (re)start or stop the test kube-apiserver of one test env.
# Tests use it to take the Kubernetes API away mid-test and bring it back.
set -euo pipefail
RUN=$1; CMD=$2
BIN=$(cat "$RUN/apiserver.bin"); PORT=$(cat "$RUN/apiserver.port")
case "$CMD" in
  start)
    mapfile -t ARGS < "$RUN/apiserver.args"
    "$BIN" "${ARGS[@]}" >>"$RUN/apiserver.log" 2>&1 &
    echo $! > "$RUN/apiserver.pid"
    TOKEN=$(head -1 "$RUN/tokens.csv" | cut -d, -f1)
    for _ in $(seq 1 150); do
      if curl -m 1 -sf --cacert "$RUN/certs/ca.crt" -H "Authorization: Bearer $TOKEN" \
           "https://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then exit 0; fi
      kill -0 "$(cat "$RUN/apiserver.pid")" 2>/dev/null || { tail -20 "$RUN/apiserver.log" >&2; exit 1; }
      sleep 0.2
    done
    echo "kube-apiserver not ready after 30 s" >&2; exit 1 ;;
  stop)
    [ -f "$RUN/apiserver.pid" ] || exit 0
    PID=$(cat "$RUN/apiserver.pid")
    kill "$PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$PID" 2>/dev/null || true
    rm -f "$RUN/apiserver.pid" ;;
  *) echo "usage: apiserver.sh RUN start|stop" >&2; exit 2 ;;
esac
