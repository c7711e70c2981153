"""What the gateway, the models' Triton backend (sr_backend), the build (sr_build) and the control plane share:
the model card schema, Triton model config reading, the settings base and the JSON log format.

Modules the Triton backend imports (engine_choice) run inside the Triton image (Python 3.10, no tritonclient,
no pydantic): they import nothing beyond the standard library.
"""
