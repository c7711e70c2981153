"""One error type for the whole API, rendered as the spec's ``{"error", "message"}`` body.

Handlers raise :class:`ApiError`; the middleware in :mod:`controlplane.app` turns it into a response,
so every status/code pair in the spec tables is produced in exactly one place.
"""

from __future__ import annotations

import math


class ApiError(Exception):
    """An error with the HTTP status and spec error code it must be reported as."""

    def __init__(self, status: int, error: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        """The JSON body the spec requires for every error."""
        return {"error": self.error, "message": self.message}


def invalid_request(message: str) -> ApiError:
    """400: malformed body, missing field or a configuration the spec forbids."""
    return ApiError(400, "invalid_request", message)


def unauthorized(message: str = "authentication required") -> ApiError:
    """401: no token, an invalid token, or a token without the project scope an operation needs."""
    return ApiError(401, "unauthorized", message)


def forbidden(message: str) -> ApiError:
    """403: the caller's roles lack the permission, or Kubernetes refused the operation."""
    return ApiError(403, "forbidden", message)


def not_found(message: str) -> ApiError:
    """404: the deployment (or a referenced object) does not exist or is not visible to the caller."""
    return ApiError(404, "not_found", message)


def conflict(message: str) -> ApiError:
    """409: a name clash or a Kubernetes update conflict."""
    return ApiError(409, "conflict", message)


def unprocessable(message: str, error: str = "invalid_request") -> ApiError:
    """422: invalid backend reference, or Kubernetes rejected the workload."""
    return ApiError(422, error, message)


def backend_unavailable(message: str) -> ApiError:
    """502: the Kubernetes API could not be reached."""
    return ApiError(502, "backend_unavailable", message)


def unavailable(message: str) -> ApiError:
    """503: Kubernetes or monitoring is not configured, or the identity service (Keystone) is unreachable."""
    return ApiError(503, "unavailable", message)


def internal(message: str) -> ApiError:
    """500: anything else; the message names the failed operation, never internals."""
    return ApiError(500, "internal_error", message)


def too_many_requests(message: str, retry_after_s: float) -> ApiError:
    """429: a per-user or per-client limit is reached; ``Retry-After`` says when to try again."""
    return ApiError(429, "too_many_requests", message, {"Retry-After": str(max(1, math.ceil(retry_after_s)))})


def payload_too_large(message: str) -> ApiError:
    """413: the request body is over the limit."""
    return ApiError(413, "invalid_request", message)
