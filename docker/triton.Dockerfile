# sr-triton: NVIDIA's official Triton server image plus what the models' Python backend imports (sr_backend,
# ONNX Runtime, tokenizers). GPU variant: ORT=onnxruntime-gpu (CUDA + TensorRT execution providers).
#   docker build -f docker/triton.Dockerfile --build-arg TRITON_BASE=<registry>/nvidia/tritonserver:24.08-py3 \
#     --build-arg ORT=onnxruntime -t sr-triton:0.1.0-cpu .
#   ... --build-arg ORT=onnxruntime-gpu -t sr-triton:0.1.0-gpu .
# TRITON_BASE must name the official image in your registry (by digest, to pin it).
ARG TRITON_BASE=tritonserver:24.08-py3
FROM ${TRITON_BASE}
ARG ORT=onnxruntime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    SR_BACKEND_PYTHONPATH=/opt/sr-gateway
COPY sr_backend /opt/sr-gateway/sr_backend
RUN python3 -m pip install "${ORT}>=1.18,<2" "tokenizers>=0.20,<0.24" "numpy>=1.26,<2" "scipy>=1.11,<2" "pillow>=10,<13" \
 && groupadd --gid 10001 sr && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sr
USER 10001:10001
