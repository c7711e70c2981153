"""One error type for the whole API, rendered as the spec's ``{"error", "message"}`` body.

Handlers raise :class:`ApiError`; the middleware in :mod:`controlplane.app` turns it into a response,
so every status/code pair in the spec tables is produced in exactly one place.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error with the HTTP status and spec error code it must be reported as."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message

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
