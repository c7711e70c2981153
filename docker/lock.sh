#!/bin/bash
# Regenerates docker/requirements/*.txt: every package the images pip-install, pinned to one version with the sha256
# of each of its files, for `pip install --require-hashes` in docker/*.Dockerfile. Run it after changing
# pyproject.toml's dependencies or docker/requirements/*.in, and commit the results (the builds never resolve).
#
#   bash docker/lock.sh            (needs uv: .venv/bin/pip install 'uv>=0.5,<1'; UV=path to use another)
#
# uv resolves for the images' interpreter and platform, not this machine's: CPython 3.11 on glibc 2.36
# (python:3.11-slim-bookworm) for the gateway and control plane, CPython 3.10 (Ubuntu 22.04, Triton 24.08) for the
# Triton image. The index is uv's default (UV_DEFAULT_INDEX or UV_INDEX to change it, never written into the files).
# TORCH_WHEELS: a directory with the torch 2.13.0+cpu wheel the gateway's export stage needs (default /opt/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
REQ=docker/requirements
command -v "$UV" >/dev/null || { echo "needs uv: .venv/bin/pip install 'uv>=0.5,<1'" >&2; exit 1; }

compile() {  # compile OUTPUT PYTHON PLATFORM INPUTS...
  local out=$1 python=$2 platform=$3; shift 3
  "$UV" pip compile --quiet --generate-hashes --no-strip-extras --no-emit-index-url --no-emit-find-links \
    --python-version "$python" --python-platform "$platform" \
    --custom-compile-command "bash docker/lock.sh" -o "$REQ/$out" "$@"
  echo "$REQ/$out: $(grep -c '^[A-Za-z0-9].*==' "$REQ/$out") packages"
}

compile build.txt 3.11 x86_64-manylinux_2_36 "$REQ/build.in"
compile controlplane.txt 3.11 x86_64-manylinux_2_36 pyproject.toml --extra controlplane
compile gateway.txt 3.11 x86_64-manylinux_2_36 pyproject.toml "$REQ/gateway-image.in"
UV_FIND_LINKS=${TORCH_WHEELS:-/opt/wheels} \
  compile gateway-build.txt 3.11 x86_64-manylinux_2_36 pyproject.toml --extra export "$REQ/gateway-build.in"
for ort in onnxruntime onnxruntime-gpu; do  # the Triton image's ORT build-arg picks one
  compile "triton-$ort.txt" 3.10 x86_64-manylinux_2_35 "$REQ/triton-$ort.in"
done
