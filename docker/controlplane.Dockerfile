# sr-controlplane: the deployments API. Configuration comes from SR_CP_* variables (k8s: the Secret
# sr-controlplane) and an in-cluster kubeconfig (k8s/base/controlplane.yaml).
#   docker build -f docker/controlplane.Dockerfile -t sr-controlplane:0.1.0 .
ARG BASE=python:3.11.10-slim-bookworm

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY sr_backend sr_backend
COPY sr_build sr_build
COPY controlplane controlplane
RUN pip wheel --wheel-dir /wheels '.[controlplane]'

FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
 && groupadd --gid 10001 sr && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sr
USER 10001:10001
EXPOSE 8090
ENTRYPOINT ["sr-controlplane"]
CMD ["serve", "--host", "0.0.0.0"]
