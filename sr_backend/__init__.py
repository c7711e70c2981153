"""Triton-side code: the shared ONNX Runtime runner that Python-backend models reuse."""
