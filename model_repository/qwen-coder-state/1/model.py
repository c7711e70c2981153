"""qwen-coder-state is a pooled graph (the LM's state at the last token): it reuses the shared ONNX Runtime model (see
sr_backend).

The Python-backend stub embeds its own interpreter and ignores PYTHONPATH, so the gateway passes the paths
the model needs (the project root and the venv's site-packages) in SR_BACKEND_PYTHONPATH.
"""

import os
import sys

sys.path[:0] = [p for p in os.environ.get("SR_BACKEND_PYTHONPATH", "").split(os.pathsep) if p]

from sr_backend.triton_model import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
