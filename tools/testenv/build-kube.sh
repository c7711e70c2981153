#!/bin/bash
# Builds kube-apiserver once from Debian's `kubernetes` source package and caches it outside the clone,
# keyed by the source-package version. Prints the path of the cached binary on stdout.
# Why: no registry reachable from CI ships a kube-apiserver binary; building takes ~5 min, so never twice.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
CACHE=${SR_K8S_CACHE:-/var/cache/sr-gateway/k8s}
mkdir -p "$CACHE"

VERSION=$(apt-cache showsrc kubernetes 2>/dev/null | awk '/^Version:/ {print $2; exit}')
[ -n "$VERSION" ] || { echo "build-kube: no deb-src for kubernetes (run install.sh first)" >&2; exit 1; }
KEY=$(echo "$VERSION" | tr -c 'A-Za-z0-9.+\n-' '_')
BIN="$CACHE/$KEY/kube-apiserver"

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q 'v1\.20\.'; then
  echo "$BIN"; exit 0
fi

# One build at a time, even if two test runs start together.
exec 9>"$CACHE/.build.lock"
flock 9
if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q 'v1\.20\.'; then echo "$BIN"; exit 0; fi

WORK="$CACHE/$KEY/src"
rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK"
echo "build-kube: building kube-apiserver from kubernetes $VERSION (about 5 minutes)" >&2
apt-get source --download-only kubernetes >/dev/null 2>&1
tar xzf kubernetes_*.orig.tar.gz
cd kubernetes-1.20.*
# Vendored reflect2 1.0.1 segfaults under Go >= 1.18 on the first custom resource; use Debian's 1.0.2.
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/go.mod
TREE=$(basename "$PWD"); TREE_VER=${TREE#kubernetes-}
export HOME="$WORK/home" CGO_ENABLED=0 KUBE_GIT_VERSION="v$TREE_VER" KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20 \
       KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=0000000000000000000000000000000000000000
mkdir -p "$HOME"
if ! make WHAT="cmd/kube-apiserver" > "$CACHE/$KEY/make.log" 2>&1; then
  tail -30 "$CACHE/$KEY/make.log" >&2; exit 1
fi
install -m 0755 _output/bin/kube-apiserver "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
cd "$CACHE"; rm -rf "$WORK"
echo "$BIN"
