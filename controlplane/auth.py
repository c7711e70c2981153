"""Keystone token validation with a short cache, and the caller's permissions.

A member's token can validate itself (``X-Auth-Token`` = ``X-Subject-Token``), so the control plane needs
no service credentials. Results are cached for ``ttl`` seconds, never past the token's own ``expires_at``:
a revoked token is rejected at the latest one TTL after revocation, an expired one at once. The cache is
bounded (least recently used entries go first, expired ones are dropped as they are met), so a flood of
distinct tokens neither grows memory nor stalls the event loop with a full rebuild. A client address that
keeps presenting invalid tokens is answered 429 without asking Keystone, so it can neither guess tokens
quickly nor turn the control plane into an amplifier against Keystone.

``global:read`` (every project's deployments) is honoured only on system-scoped tokens or tokens scoped to
the configured admin project: Keystone's ``admin`` role on an ordinary project makes its holder that
project's admin, not the platform's.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from cachetools import TLRUCache, TTLCache

from controlplane.config import client_ssl
from controlplane.errors import ApiError, forbidden, too_many_requests, unauthorized, unavailable
from controlplane.telemetry import Telemetry

log = logging.getLogger(__name__)
TOKEN_HEADER = "x-keystone-token"
GLOBAL_READ = "global:read"


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
    system_scope: bool = False
    scope_domain_id: str | None = None  # the domain of a domain-scoped token

    @property
    def owner(self) -> str:
        """Whose deployments this token works on: its project; without one (only where the spec allows it, e.g.
        create without Kubernetes) its scope's own key, so a domain's or the system's records stay theirs."""
        if self.project_id:
            return self.project_id
        if self.system_scope:
            return "system"
        if self.scope_domain_id:
            return f"domain-{self.scope_domain_id}"
        return ""

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
        """Platform admins (system scope or the admin project) may read every project's deployments."""
        return GLOBAL_READ in self.permissions


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
        cache_size: int = 10_000,
        global_read_project_id: str | None = None,
        invalid_limit: int = 20,
        invalid_window_s: float = 60.0,
    ) -> None:
        self._base = keystone_url.rstrip("/")
        self._url = self._base + "/auth/tokens"
        self._ttl = ttl_s
        self._roles = role_permissions
        self._admin_project = global_read_project_id
        # sha256(token) -> (monotonic expiry, principal or None for an invalid token); each entry expires at
        # its own time (the TTL or the token's expires_at, whichever is first).
        self._cache: TLRUCache[str, tuple[float, Principal | None]] = TLRUCache(
            maxsize=cache_size, ttu=lambda _key, value, _now: value[0], timer=time.monotonic
        )
        # client address -> [invalid tokens seen, monotonic start of the window]; the entry expires with it.
        self._invalid: TTLCache[str, list[float]] = TTLCache(
            maxsize=cache_size, ttl=invalid_window_s, timer=time.monotonic
        )
        self._invalid_limit = invalid_limit
        self._invalid_window = invalid_window_s
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

    async def authenticate(self, token: str | None, source: str | None = None) -> Principal:
        """The caller behind ``token``; 401 when absent, invalid, expired or revoked; 429 when ``source`` (the
        client address) presented too many invalid tokens in the current window."""
        if not token:
            raise unauthorized("missing x-keystone-token header")
        key = hashlib.sha256(token.encode()).hexdigest()  # never keep raw tokens as dict keys
        hit = self._cache.get(key)
        if hit is not None and hit[1] is not None:
            return hit[1]
        self._check_throttle(source)
        if hit is None:
            now = time.monotonic()
            principal, lifetime = await self._validate_with_lifetime(token)
            self._cache[key] = (now + min(self._ttl, lifetime), principal)
            if principal is not None:
                return principal
        self._count_invalid(source)
        raise unauthorized("invalid or expired token")

    def _check_throttle(self, source: str | None) -> None:
        seen = self._invalid.get(source or "")
        if seen is not None and seen[0] >= self._invalid_limit:
            retry = seen[1] + self._invalid_window - time.monotonic()
            raise too_many_requests("too many invalid tokens from this client; try again later", retry)

    def _count_invalid(self, source: str | None) -> None:
        seen = self._invalid.get(source or "")
        if seen is None:
            self._invalid[source or ""] = [1, time.monotonic()]
        else:
            seen[0] += 1  # mutate in place: the entry keeps the expiry of its window
            if seen[0] == self._invalid_limit:
                log.warning("client %s presented %d invalid tokens; throttled for the rest of the window",
                            source or "-", self._invalid_limit)

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
        return (await self._validate_with_lifetime(token))[0]

    async def _validate_with_lifetime(self, token: str) -> tuple[Principal | None, float]:
        """The principal (``None``: invalid) and how many seconds the answer stays true (``expires_at``)."""
        started = time.perf_counter()
        outcome = "error"
        try:
            principal, lifetime = await self._ask(token)
            outcome = "valid" if principal is not None else "invalid"
            return principal, lifetime
        finally:
            if self._telemetry is not None:
                self._telemetry.keystone.labels(outcome=outcome).observe(time.perf_counter() - started)

    async def _ask(self, token: str) -> tuple[Principal | None, float]:
        headers = {"X-Auth-Token": token, "X-Subject-Token": token}
        try:
            async with self._http().get(self._url, headers=headers) as resp:
                if resp.status in (401, 403, 404):
                    return None, self._ttl
                if resp.status != 200:
                    raise unavailable(f"identity service (Keystone) answered {resp.status}; try again later")
                body = await resp.json()
        except ApiError:
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise unavailable(f"identity service (Keystone) unreachable: {type(exc).__name__}") from exc
        tok = body.get("token") or {}
        lifetime = _seconds_left(tok.get("expires_at"))
        if lifetime is not None and lifetime <= 0:
            return None, self._ttl
        return self._principal(tok), self._ttl if lifetime is None else lifetime

    def _principal(self, tok: dict[str, Any]) -> Principal:
        user = tok.get("user") or {}
        project = tok.get("project") or {}
        domain = project.get("domain") or {}
        roles = frozenset(str(r.get("name", "")) for r in tok.get("roles") or [])
        perms: set[str] = set()
        for role in roles:
            perms |= self._roles.get(role, frozenset())
        system = bool((tok.get("system") or {}).get("all"))
        admin_project = self._admin_project is not None and project.get("id") == self._admin_project
        if not (system or admin_project):
            perms.discard(GLOBAL_READ)
        return Principal(
            user_id=str(user.get("id", "")),
            user_name=user.get("name"),
            project_id=project.get("id"),
            project_name=project.get("name"),
            domain_id=domain.get("id"),
            domain_name=domain.get("name"),
            roles=roles,
            permissions=frozenset(perms),
            system_scope=system,
            scope_domain_id=(tok.get("domain") or {}).get("id"),
        )


def _seconds_left(expires_at: Any) -> float | None:
    """Seconds until Keystone's ``expires_at`` (ISO 8601, UTC); ``None`` when absent or unreadable."""
    if not isinstance(expires_at, str):
        return None
    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()
