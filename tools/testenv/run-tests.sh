#!/bin/bash
# Brings the test environment up, runs the controlplane suite on SQLite and on PostgreSQL, and tears
# everything down again, also on failure or interrupt. Extra arguments go to pytest.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PYTEST=${PYTEST:-$REPO/.venv/bin/pytest}
RUN=""
cleanup() { [ -n "$RUN" ] && "$HERE/down.sh" "$RUN"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
RUN=$(bash "$HERE/up.sh") || exit 1
# shellcheck disable=SC1091
source "$RUN/env.sh"
export SR_CP_REQUIRE_TESTENV=1
rc=0
for db in sqlite postgresql; do
  echo "== controlplane tests, catalog on $db"
  SR_CP_TEST_DB=$db "$PYTEST" -q -p no:cacheprovider "$REPO/tests/controlplane" "$@" || rc=1
done
exit $rc
