# sr-triton: NVIDIA's official Triton server image plus what the models' Python backend imports (sr_backend,
# ONNX Runtime, tokenizers). GPU variant: ORT=onnxruntime-gpu (CUDA + TensorRT execution providers).
#   docker build -f docker/triton.Dockerfile --build-arg TRITON_BASE=<registry>/nvidia/tritonserver:24.08-py3 \
#     --build-arg ORT=onnxruntime -t sr-triton:0.1.0-cpu .
#   ... --build-arg ORT=onnxruntime-gpu -t sr-triton:0.1.0-gpu .
# TRITON_BASE must name the official image in your registry (by digest, to pin it).
# Packages come from docker/requirements/triton-$ORT.txt with --require-hashes (regenerate with docker/lock.sh).
ARG TRITON_BASE=tritonserver:24.08-py3
FROM ${TRITON_BASE}
ARG ORT=onnxruntime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    SR_BACKEND_PYTHONPATH=/opt/sr-gateway
COPY docker/requirements /tmp/requirements
COPY sr_common /opt/sr-gateway/sr_common
COPY sr_backend /opt/sr-gateway/sr_backend
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    python3 -m pip install --require-hashes -r "/tmp/requirements/triton-${ORT}.txt" && rm -rf /tmp/requirements \
 && groupadd --gid 10001 sr && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sr
USER 10001:10001
