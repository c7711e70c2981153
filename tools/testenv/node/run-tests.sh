#!/bin/bash
# Brings the one-node cluster up, runs tests/cluster on it, takes it down, then checks (tests/cluster/test_teardown.py,
# a second pytest session) that nothing is left on the host. Tears down on success, failure and interrupt alike.
# Extra arguments go to the first pytest session.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
PYTEST=${PYTEST:-$REPO/.venv/bin/pytest}
RUN=""
cleanup() { [ -n "$RUN" ] && [ -d "$RUN" ] && "$HERE/down.sh" "$RUN"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
start=$SECONDS
RUN=$(bash "$HERE/up.sh") || exit 1
echo "== node up in $((SECONDS - start)) s: $RUN"
# shellcheck disable=SC1091
source "$RUN/env.sh"
# the project's images (built by docker/build_local.sh when their inputs changed, else only imported): the control
# plane's, and the gateway's (its Deployment's three containers on CPU nodes)
start=$SECONDS
"$HERE/images.sh" "$RUN" controlplane gateway || exit 1
echo "== images in $((SECONDS - start)) s"
export SR_NODE_REQUIRE=1
rc=0
"$PYTEST" -q -p no:cacheprovider "$REPO/tests/cluster" --ignore="$REPO/tests/cluster/test_teardown.py" "$@" || rc=1
start=$SECONDS
SR_NODE_KEEP_RUN=1 "$HERE/down.sh" "$RUN" || rc=1
echo "== node down in $((SECONDS - start)) s"
(unset SR_NODE_DIR KUBECONFIG SR_NODE_KUBECTL SR_NODE_NAME
 SR_NODE_TORN_DOWN=$RUN "$PYTEST" -q -p no:cacheprovider "$REPO/tests/cluster/test_teardown.py") || rc=1
rm -rf "$RUN"; RUN=""
exit $rc
