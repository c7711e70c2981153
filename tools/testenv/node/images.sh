#!/bin/bash
# images.sh RUN|--build NAME...: puts images into the node's containerd (namespace k8s.io), each only when its content changed.
#   pause, busybox    small images made here from Debian's catatonit / busybox-static binaries (no registry is
#                     reachable): the pod sandbox's pause process, and the tests' own simple pods
#   gateway, controlplane, triton
#                     the project's images from docker/build_local.sh (built when the inputs' git tree hash changed)
# Why buildah -> docker-archive -> `ctr images import`: no registry runs here; the pods use imagePullPolicy: Never.
# The gateway's strict model build needs the torch build the cards were made with (docker/build_local.sh's header):
# where EXTRA_WHEELS is unset, that wheel (its version from docker/requirements/gateway-build.txt) is looked for in
# $PIP_FIND_LINKS, ~/.cache/sr-gateway/wheels and /opt/wheels, and passed on.
# --build: only build (no node needed), e.g. ahead of a run. The key of each import (a hash of its content) is kept in $STORE/imported/, so a second run imports nothing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
RUN=${1:?usage: images.sh RUN|--build NAME...}; shift
STORE=${SR_NODE_STORE:-/var/lib/sr-gateway-node}
STORAGE=${STORAGE:-vfs}   # as docker/build_local.sh stores its images
B=(buildah --storage-driver "$STORAGE")
BUILD_ONLY=0
if [ "$RUN" = --build ]; then BUILD_ONLY=1; else CTR=(ctr --address "$(cat "$RUN/containerd.sock")" -n k8s.io); fi
TAG=${TAG:-0.1.0}
mkdir -p "$STORE/imported"
WORK=$(mktemp -d /tmp/sr-node-images.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

import() {  # import IMAGE KEY: from buildah's storage into containerd, unless KEY was imported and the image is there
  local image=$1 key=$2 stamp="$STORE/imported/$(echo "$1" | tr '/:' '__')"
  [ "$BUILD_ONLY" = 0 ] || return 0
  if [ "$(cat "$stamp" 2>/dev/null)" = "$key" ] && "${CTR[@]}" images ls -q | grep -qxF "$image"; then
    echo "$image: up to date ($key)"; return 0
  fi
  rm -f "$WORK/image.tar"
  "${B[@]}" push --quiet "$image" "docker-archive:$WORK/image.tar:$image" >/dev/null
  "${CTR[@]}" images import --no-unpack=false "$WORK/image.tar" >/dev/null
  "${CTR[@]}" images ls -q | grep -qxF "$image" || { echo "$image: not in containerd after import" >&2; return 1; }
  echo "$key" > "$stamp"
  echo "$image: imported ($key)"
}

local_image() {  # local_image NAME BINARY ENTRYPOINT...: FROM scratch + one static binary
  local name=$1 bin=$2; shift 2
  local image="localhost/sr-node-$name:1" key
  key=$(cat "$bin" "$0" <(printf "%s\n" "$name" "$@") | sha256sum | cut -c1-16)  # this recipe too
  if ! "${B[@]}" inspect --type image "$image" 2>/dev/null | grep -q "\"sr.node.key\": \"$key\""; then
    local old
    old=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
    mkdir -p "$WORK/$name/bin"; cp "$bin" "$WORK/$name/bin/"
    if [ "$name" = busybox ]; then  # the applets as links, so a shell script in the pod finds sleep, httpd, wget...
      for applet in $("$bin" --list); do [ -e "$WORK/$name/bin/$applet" ] || ln -s busybox "$WORK/$name/bin/$applet"; done
    fi
    printf 'FROM scratch\nCOPY bin /bin/\nLABEL sr.node.key=%s\nENTRYPOINT %s\n' "$key" \
      "$(printf '%s\n' "$@" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().split()))')" \
      > "$WORK/$name/Containerfile"
    "${B[@]}" bud --isolation chroot -f "$WORK/$name/Containerfile" -t "$image" "$WORK/$name" >"$WORK/$name.log" 2>&1 \
      || { cat "$WORK/$name.log" >&2; return 1; }
    [ -z "$old" ] || "${B[@]}" rmi "$old" >/dev/null 2>&1 || true  # the image the tag moved from
  fi
  import "$image" "$key"
}

torch_wheel() {  # the locked torch+cpu wheel for the gateway's build, where this machine has it
  local version dir found
  version=$(sed -n 's/^torch==\([^ ]*\) .*/\1/p' "$REPO/docker/requirements/gateway-build.txt")
  for dir in ${PIP_FIND_LINKS:-} "$HOME/.cache/sr-gateway/wheels" /opt/wheels; do
    [ -d "$dir" ] || continue
    found=$(find "$dir" -maxdepth 2 -name "torch-$version-cp311-*.whl" -print -quit)
    [ -z "$found" ] || { echo "$found"; return 0; }
  done
}

project_image() {  # project_image TARGET: docker/build_local.sh's image, rebuilt when its inputs' tree hash changed
  local target=$1 image="localhost/sr-$1:$TAG" key
  # the git objects of what the Dockerfile copies from the build context (build_local.sh builds from HEAD) and of
  # docker/ itself (the Dockerfile, the locked requirements)
  local inputs
  inputs=$(awk '$1 == "COPY" && $2 !~ /^--from/ {for (i = 2; i < NF; i++) print $i}' "$REPO/docker/$target.Dockerfile")
  # shellcheck disable=SC2086
  key=$(cd "$REPO" && for p in docker $inputs; do git rev-parse "HEAD:$p"; done | sha256sum | cut -c1-16)
  local built="$STORE/built/$target" id
  mkdir -p "$STORE/built"
  id=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
  if [ -z "$id" ] || [ "$(cat "$built" 2>/dev/null)" != "$key $id" ]; then
    local wheels=${EXTRA_WHEELS:-}
    [ -n "$wheels" ] || [ "$target" != gateway ] || wheels=$(torch_wheel)
    ( cd "$REPO" && WORK="$WORK/build" EXTRA_WHEELS="$wheels" bash docker/build_local.sh "$target" ) >&2  # its temp files go with ours
    local old=$id
    id=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$image")
    # the image the tag moved from is nobody's now: give its GBs back
    [ -z "$old" ] || [ "$old" = "$id" ] || "${B[@]}" rmi "$old" >/dev/null 2>&1 || true
    echo "$key $id" > "$built"
  fi
  import "$image" "$key"
  # k8s/ names the images without a registry (sr-controlplane:0.1.0), which the CRI resolves to docker.io/library/
  [ "$BUILD_ONLY" = 1 ] || "${CTR[@]}" images tag --force "$image" "docker.io/library/sr-$target:$TAG" >/dev/null
}

for name in "$@"; do
  case "$name" in
    pause) local_image pause "$(command -v catatonit)" /bin/catatonit -P ;;
    busybox) local_image busybox "$(command -v busybox)" /bin/busybox ;;
    gateway|controlplane|triton) project_image "$name" ;;
    *) echo "images.sh: unknown image $name" >&2; exit 2 ;;
  esac
done
