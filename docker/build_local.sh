#!/bin/bash
# Builds docker/*.Dockerfile without a Docker daemon, as root: buildah (Debian package `buildah`) with vfs storage
# and chroot isolation, then a smoke check of each image (its entrypoint's --help as the image's user, and the image
# config: non-root USER, ENTRYPOINT; the server answering as that user: the control plane's /healthz, the gateway's
# /health ready, i.e. its Triton serving MiniLM with the golden check passed, that Triton on jemalloc, its stubs not).
#
#   bash docker/build_local.sh [controlplane] [gateway]     (default: controlplane)
#
# BASE: the Dockerfiles' base (python:3.11.10-slim-bookworm) where a container registry is reachable. Where none is
# (this project's machines reach PyPI, npm and Debian only), leave BASE unset: a stand-in base is made from Debian
# bookworm with debootstrap (Debian's python3.11 and pip where the official image has its own build of 3.11, plus
# this machine's CA bundle). The stand-in tests the Dockerfiles' own steps, not the official base image.
# pip inside the build reaches the same package index as this machine through PIP_CONF (default /etc/pip.conf),
# given to the build as the secret `pip.conf`: mounted only while a RUN step runs, never copied into an image or
# the build context, so no layer of any image carries this machine's pip configuration (docker/*.Dockerfile).
# The build context is the committed tree (git archive HEAD), never uncommitted edits; SRC=worktree uses the work tree.
# EXTRA_WHEELS: wheel files pip inside the build should also find (served on 127.0.0.1 as a simple index and passed as
# --build-arg PIP_EXTRA_INDEX_URL), e.g. the torch 2.13.0+cpu wheel the gateway's strict model build needs.
# Env: BASE, TAG (0.1.0), WORK (a temp dir), STORAGE (vfs), SRC (head), EXTRA_WHEELS, PIP_CONF, BUILD (0: only check
# an image already built).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=("${@:-controlplane}")
TAG=${TAG:-0.1.0}
STORAGE=${STORAGE:-vfs}
WORK=${WORK:-$(mktemp -d /tmp/sr-images.XXXXXX)}
B=(buildah --storage-driver "$STORAGE")
step() { printf '\n== %s\n' "$*"; }

command -v buildah >/dev/null || { echo "needs buildah: apt-get install buildah" >&2; exit 1; }

if [ -z "${BASE:-}" ]; then
  BASE=localhost/sr-standin-python:3.11-bookworm
  if ! "${B[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
    step "stand-in base $BASE (debootstrap bookworm + python3.11 + pip)"
    command -v debootstrap >/dev/null || { echo "needs debootstrap: apt-get install debootstrap" >&2; exit 1; }
    MIRROR=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)
    ROOT="$WORK/rootfs"
    debootstrap --variant=minbase --include=python3.11,libpython3.11,python3-pip,python3-venv,ca-certificates bookworm \
      "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
    # what python:*-slim gives the Dockerfiles: `python` and `pip` on PATH, pip allowed to install system-wide, and a
    # shared libpython (Triton's Python-backend stub links against it)
    ln -sf /usr/bin/python3 "$ROOT/usr/local/bin/python"
    ln -sf /usr/bin/pip3 "$ROOT/usr/local/bin/pip"
    rm -f "$ROOT"/usr/lib/python3.*/EXTERNALLY-MANAGED
    cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
    tar -C "$ROOT" -cf "$WORK/rootfs.tar" .
    printf 'FROM scratch\nADD rootfs.tar /\nENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin\n' \
      >"$WORK/Containerfile"
    "${B[@]}" bud --isolation chroot -f "$WORK/Containerfile" -t "$BASE" "$WORK" >"$WORK/base.log" 2>&1 \
      || { tail -20 "$WORK/base.log" >&2; exit 1; }
  fi
fi

CONTEXT=.
if [ "${SRC:-head}" = head ]; then
  CONTEXT="$WORK/context"
  rm -rf "$CONTEXT"; mkdir -p "$CONTEXT"
  git archive HEAD | tar -x -C "$CONTEXT"
  echo "context: $(git rev-parse --short HEAD) (git archive)"
fi

# the build secret pip.conf (an empty one where this machine has none: a Dockerfile's secret mount then finds a file)
PIP_CONF=${PIP_CONF:-/etc/pip.conf}
if [ ! -f "$PIP_CONF" ]; then PIP_CONF="$WORK/empty-pip.conf"; : >"$PIP_CONF"; fi
SECRETS=(--secret "id=pip.conf,src=$PIP_CONF")

INDEX_PID=""
EXTRA=()
if [ -n "${EXTRA_WHEELS:-}" ]; then
  for wheel in $EXTRA_WHEELS; do
    project=$(basename "$wheel" | cut -d- -f1 | tr '_.' '--' | tr '[:upper:]' '[:lower:]')
    mkdir -p "$WORK/index/simple/$project"
    ln -sf "$(realpath "$wheel")" "$WORK/index/simple/$project/"
  done
  index_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  python3 -m http.server --bind 127.0.0.1 --directory "$WORK/index" "$index_port" >"$WORK/index.log" 2>&1 &
  INDEX_PID=$!
  trap 'kill "$INDEX_PID" 2>/dev/null || true' EXIT
  EXTRA=(--build-arg "PIP_EXTRA_INDEX_URL=http://127.0.0.1:$index_port/simple")
  echo "extra wheels: $(ls "$WORK"/index/simple/*/ | tr '\n' ' ')"
fi

for target in "${TARGETS[@]}"; do
  image="localhost/sr-$target:$TAG"
  step "build $image from docker/$target.Dockerfile (BASE=$BASE)"
  start=$SECONDS
  if [ "${BUILD:-1}" = 0 ] && "${B[@]}" inspect --type image "$image" >/dev/null 2>&1; then
    echo "BUILD=0: checking the image built before"
  elif ! "${B[@]}" bud --isolation chroot --layers=false -f "$CONTEXT/docker/$target.Dockerfile" --build-arg "BASE=$BASE" \
      "${SECRETS[@]}" "${EXTRA[@]}" -t "$image" "$CONTEXT" >"$WORK/$target.log" 2>&1; then
    tail -30 "$WORK/$target.log" >&2; echo "build of $image failed; whole log: $WORK/$target.log" >&2; exit 1
  fi
  grep -E '(^|\] )(STEP|COMMIT) ' "$WORK/$target.log" | cut -c1-160 || true
  echo "built in $((SECONDS - start)) s"

  step "smoke check $image"
  config() { "${B[@]}" inspect --type image "$image" | python3 -c "import json, sys; print($1)"; }
  user=$(config 'json.load(sys.stdin)["OCIv1"]["config"].get("User", "")')
  read -r -a entrypoint <<<"$(config '" ".join(json.load(sys.stdin)["OCIv1"]["config"]["Entrypoint"])')"
  cli=${entrypoint[-1]}
  echo "USER $user, ENTRYPOINT ${entrypoint[*]}"
  [ "$user" = "10001:10001" ] || { echo "image runs as '$user', not 10001:10001" >&2; exit 1; }
  if [ "$target" = gateway ]; then  # PID 1 is an init that forwards signals and reaps orphans
    [ "${entrypoint[0]}" = dumb-init ] || { echo "gateway ENTRYPOINT does not start with dumb-init" >&2; exit 1; }
  fi
  ctr=$("${B[@]}" from "$image")
  # chroot isolation runs the image's processes as this host's processes, and `buildah run` does not pass SIGTERM
  # on to them: a smoke check's gateway (dumb-init's child) was found still serving hours later (2026-12-02). Nor is
  # their root the container's mount (`buildah run` gives them one of its own, seen 2026-12-06), so they are found as
  # the smoke server's descendants, listed before anything is signalled (a killed parent orphans them) — never by
  # user id: a test node's pods run as 10001 too.
  stop_server() {
    local sig pids
    [ -n "$server" ] || return 0
    pids="$server $(descendants "$server" | tr '\n' ' ')"
    for sig in TERM KILL; do
      # shellcheck disable=SC2086  # one pid per word
      kill -"$sig" $pids 2>/dev/null || true  # some have exited by now
      [ "$sig" = KILL ] || sleep 5
    done
    wait "$server" 2>/dev/null || true
    server=""
    return 0
  }
  descendants() {  # every process below pid $1
    local table queue=("$1") pid child
    table=$(ps -e -o pid=,ppid=)
    while [ "${#queue[@]}" -gt 0 ]; do
      pid=${queue[0]}; queue=("${queue[@]:1}")
      for child in $(awk -v p="$pid" '$2 == p {print $1}' <<<"$table"); do echo "$child"; queue+=("$child"); done
    done
  }
  server=""
  trap 'stop_server; "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true; [ -z "$INDEX_PID" ] || kill "$INDEX_PID" 2>/dev/null || true' EXIT
  "${B[@]}" run --isolation chroot --user "$user" "$ctr" -- "$cli" --help | head -5
  "${B[@]}" run --isolation chroot --user "$user" "$ctr" -- id -u | grep -qx 10001
  # the server itself, as the image's user, on 127.0.0.1 (chroot isolation shares this host's network)
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  case "$target" in
    controlplane) args=(serve --host 127.0.0.1 --port "$port"); env=(--env "SR_CP_DATABASE_URL=sqlite+aiosqlite:////tmp/cp.db")
                  probe=/healthz ;;
    *) args=(serve --host 127.0.0.1 --port "$port" --models all-minilm-l6-v2); env=()
       probe=/health ;;  # 200 only once Triton (in the image) serves the model and its golden check passed
  esac
  timeout 300 "${B[@]}" run --isolation chroot --user "$user" "${env[@]}" "$ctr" -- "${entrypoint[@]}" "${args[@]}" \
    >"$WORK/$target-serve.log" 2>&1 &
  server=$!
  answer=""
  for _ in $(seq 1 280); do
    answer=$(curl -sf -m 2 "http://127.0.0.1:$port$probe") && break
    kill -0 "$server" 2>/dev/null || break
    sleep 1
  done
  # the gateway's tritonserver runs on the image's jemalloc (issue 23), and its Python stubs do not (they abort on it)
  # (found among the server's descendants: `buildah run` gives them a root of its own, not the mount above)
  allocator=ok
  if [ -n "$answer" ] && [ "$target" = gateway ]; then
    allocator="tritonserver without jemalloc"
    for pid in $(descendants "$server"); do
      case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
        tritonserver) grep -q libjemalloc "/proc/$pid/maps" && allocator=ok ;;
        triton_python*) ! grep -q libjemalloc "/proc/$pid/maps" || { allocator="a stub on jemalloc"; break; } ;;
      esac
    done
  fi
  stop_server
  [ -n "$answer" ] || { tail -20 "$WORK/$target-serve.log" >&2; echo "no answer on $probe" >&2; exit 1; }
  echo "GET $probe: $answer"
  [ "$allocator" = ok ] || { echo "allocator check failed: $allocator" >&2; exit 1; }
  [ "$target" != gateway ] || echo "tritonserver maps libjemalloc, no Python stub does"
  "${B[@]}" rm "$ctr" >/dev/null
  trap '[ -z "$INDEX_PID" ] || kill "$INDEX_PID" 2>/dev/null || true' EXIT
  echo "ok: $image ($("${B[@]}" images --format '{{.Size}}' "$image"))"
done
