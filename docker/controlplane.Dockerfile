# sr-controlplane: the deployments API. Configuration comes from SR_CP_* variables (k8s: the Secret
# sr-controlplane) and an in-cluster kubeconfig (k8s/base/controlplane.yaml).
#   docker build -f docker/controlplane.Dockerfile -t sr-controlplane:0.1.0 .
# Every third-party package is installed from docker/requirements/*.txt with --require-hashes (regenerate them with
# docker/lock.sh); the only unhashed install is this repository's own wheel, built here with --no-index.
# A private index: give pip its configuration as a build secret (never a COPY, so it stays out of every layer):
#   docker build --secret id=pip.conf,src=$HOME/.config/pip/pip.conf ...
ARG BASE=python:3.11.10-slim-bookworm

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY docker/requirements/build.txt /tmp/requirements/build.txt
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    pip install --require-hashes -r /tmp/requirements/build.txt
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY sr_common sr_common
COPY sr_backend sr_backend
COPY sr_build sr_build
COPY controlplane controlplane
RUN pip wheel --no-index --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${BASE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
COPY docker/requirements/controlplane.txt /tmp/requirements/controlplane.txt
COPY --from=build /wheels /wheels
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    pip install --require-hashes -r /tmp/requirements/controlplane.txt \
 && pip install --no-index --no-deps /wheels/*.whl && pip check \
 && rm -rf /wheels /tmp/requirements \
 && groupadd --gid 10001 sr && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sr
USER 10001:10001
EXPOSE 8090
ENTRYPOINT ["sr-controlplane"]
CMD ["serve", "--host", "0.0.0.0"]
