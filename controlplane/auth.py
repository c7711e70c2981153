"""Keystone token validation with a short cache, and the caller's permissions.

A member's token can validate itself (``X-Auth-Token`` = ``X-Subject-Token``), so the control plane needs
no service credentials. Results are cached for ``ttl`` seconds: a revoked token is rejected at the latest
one TTL after revocation.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from controlplane.config import client_ssl
from controlplane.errors import ApiError, forbidden, unauthorized, unavailable
from controlplane.telemetry import Telemetry

TOKEN_HEADER = "x-keystone-token"


@dataclass(frozen=True)
class Principal:
    """Who is calling, in which project (``None`` without project scope), and what they may do."""

    user_id: str
    user_name: str | None
    project_id: str | None
    project_name: str | None
    domain_id: str | None
    domain_name: str | None
    roles: frozenset[str]
    permissions: frozenset[str]

    def require(self, permission: str) -> None:
        """403 unless the caller's roles grant ``permission``."""
        if permission not in self.permissions:
            raise forbidden(f"missing permission {permission}")

    def require_project(self) -> str:
        """401 unless the token is project-scoped; Kubernetes operations are always per project."""
        if not self.project_id:
            raise unauthorized("a project-scoped token is required for this operation")
        return self.project_id

    @property
    def global_read(self) -> bool:
        """Admins may read every project's deployments."""
        return "global:read" in self.permissions


class KeystoneAuth:
    """Validates tokens against ``GET /v3/auth/tokens`` and caches the outcome briefly."""

    def __init__(
        self,
        keystone_url: str,
        ttl_s: float,
        role_permissions: dict[str, frozenset[str]],
        *,
        ca_file: str = "",
        timeout_s: float = 10.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._base = keystone_url.rstrip("/")
        self._url = self._base + "/auth/tokens"
        self._ttl = ttl_s
        self._roles = role_permissions
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._ssl = client_ssl(ca_file)
        self._timeout_s = timeout_s
        self._telemetry = telemetry

    async def close(self) -> None:
        """Release the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s), connector=aiohttp.TCPConnector(ssl=self._ssl)
            )
        return self._session

    async def authenticate(self, token: str | None) -> Principal:
        """The caller behind ``token``; 401 when absent, invalid, expired or revoked."""
        if not token:
            raise unauthorized("missing x-keystone-token header")
        key = hashlib.sha256(token.encode()).hexdigest()  # never keep raw tokens as dict keys
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            principal = hit[1]
        else:
            principal = await self._validate(token)
            self._cache[key] = (now + self._ttl, principal)
            if len(self._cache) > 10_000:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        if principal is None:
            raise unauthorized("invalid or expired token")
        return principal

    async def still_valid(self, token: str) -> bool:
        """Ask Keystone now, bypassing the cache (long terminal sessions); an unreachable Keystone is not
        taken as a revocation."""
        try:
            return await self._validate(token) is not None
        except ApiError:
            return True

    async def check(self) -> None:
        """Readiness: Keystone answers at all (any status below 500); raises 503 otherwise."""
        try:
            async with self._http().get(self._base) as resp:
                if resp.status >= 500:
                    raise unavailable(f"identity service (Keystone) answered {resp.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unavailable(f"identity service (Keystone) unreachable: {type(exc).__name__}") from exc

    async def _validate(self, token: str) -> Principal | None:
        started = time.perf_counter()
        outcome = "error"
        try:
            principal = await self._ask(token)
            outcome = "valid" if principal is not None else "invalid"
            return principal
        finally:
            if self._telemetry is not None:
                self._telemetry.keystone.labels(outcome=outcome).observe(time.perf_counter() - started)

    async def _ask(self, token: str) -> Principal | None:
        headers = {"X-Auth-Token": token, "X-Subject-Token": token}
        try:
            async with self._http().get(self._url, headers=headers) as resp:
                if resp.status in (401, 403, 404):
                    return None
                if resp.status != 200:
                    raise unavailable(f"identity service (Keystone) answered {resp.status}; try again later")
                body = await resp.json()
        except ApiError:
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unavailable(f"identity service (Keystone) unreachable: {type(exc).__name__}") from exc
        return self._principal(body.get("token") or {})

    def _principal(self, tok: dict[str, Any]) -> Principal:
        user = tok.get("user") or {}
        project = tok.get("project") or {}
        domain = project.get("domain") or {}
        roles = frozenset(str(r.get("name", "")) for r in tok.get("roles") or [])
        perms: set[str] = set()
        for role in roles:
            perms |= self._roles.get(role, frozenset())
        return Principal(
            user_id=str(user.get("id", "")),
            user_name=user.get("name"),
            project_id=project.get("id"),
            project_name=project.get("name"),
            domain_id=domain.get("id"),
            domain_name=domain.get("name"),
            roles=roles,
            permissions=frozenset(perms),
        )
