#!/bin/bash
# build-kube.sh [--node]: builds Kubernetes binaries once from Debian's `kubernetes` source package and caches
# them outside the clone, keyed by the source-package version.
#   (no argument)  ensures kube-apiserver; prints its path (the control plane's test env needs only it).
#   --node         ensures kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl
#                  (the one-node cluster, tools/testenv/node); prints the directory that holds them.
# Why: no registry reachable from CI ships these binaries; whatever is missing is built in ONE `make WHAT=...` so the
# shared packages and the code generators run once (the generators alone take minutes on 2 cores), never twice.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
CACHE=${SR_K8S_CACHE:-/var/cache/sr-gateway/k8s}
mkdir -p "$CACHE"

MODE=apiserver
case "${1:-}" in
  "") ;;
  --node) MODE=node ;;
  *) echo "usage: build-kube.sh [--node]" >&2; exit 2 ;;
esac
if [ "$MODE" = node ]; then
  WANT=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
else
  WANT=(kube-apiserver)
fi

VERSION=$(apt-cache showsrc kubernetes 2>/dev/null | awk '/^Version:/ {print $2; exit}')
[ -n "$VERSION" ] || { echo "build-kube: no deb-src for kubernetes (run install.sh first)" >&2; exit 1; }
KEY=$(echo "$VERSION" | tr -c 'A-Za-z0-9.+\n-' '_')
DIR="$CACHE/$KEY"

built() {  # built NAME: the cached binary exists and is the 1.20 build (not a half-written file)
  local bin="$DIR/$1"
  [ -x "$bin" ] || return 1
  if [ "$1" = kubectl ]; then "$bin" version --client 2>/dev/null | grep -q 'v1\.20\.'
  else "$bin" --version 2>/dev/null | grep -q 'v1\.20\.'; fi
}
missing() { local c; for c in "${WANT[@]}"; do built "$c" || echo "$c"; done; }
result() { if [ "$MODE" = node ]; then echo "$DIR"; else echo "$DIR/kube-apiserver"; fi; }

[ -z "$(missing)" ] && { result; exit 0; }

# One build at a time, even if two test runs start together.
exec 9>"$CACHE/.build.lock"
flock 9
mapfile -t TODO < <(missing)
[ "${#TODO[@]}" -eq 0 ] && { result; exit 0; }

mkdir -p "$DIR"
WORK="$DIR/src"
rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK"
echo "build-kube: building ${TODO[*]} from kubernetes $VERSION (apiserver alone: ~5 min on 8 cores, ~25 on 2)" >&2
apt-get source --download-only kubernetes >/dev/null 2>&1
tar xzf kubernetes_*.orig.tar.gz
cd kubernetes-1.20.*
# Vendored reflect2 1.0.1 segfaults under Go >= 1.18 on the first custom resource; use Debian's 1.0.2.
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/go.mod
TREE=$(basename "$PWD"); TREE_VER=${TREE#kubernetes-}
# The Makefile builds in GOPATH mode (GO111MODULE=off, k8s.io/kubernetes linked into _output's GOPATH), as
# hack/lib/init.sh sets up; CGO off gives static binaries that need nothing from the host.
export HOME="$WORK/home" CGO_ENABLED=0 KUBE_GIT_VERSION="v$TREE_VER" KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
       KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=0000000000000000000000000000000000000000
mkdir -p "$HOME"
WHAT=$(printf 'cmd/%s ' "${TODO[@]}")
if ! make WHAT="${WHAT% }" > "$DIR/make.log" 2>&1; then
  tail -30 "$DIR/make.log" >&2; exit 1
fi
for c in "${TODO[@]}"; do
  install -m 0755 "_output/bin/$c" "$DIR/$c.tmp"
  mv "$DIR/$c.tmp" "$DIR/$c"  # atomic: a running apiserver keeps its old file
done
cd "$DIR"; rm -rf "$WORK"
result
