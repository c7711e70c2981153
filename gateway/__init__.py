"""sr-gateway: the worker HTTP API in front of NVIDIA Triton."""
