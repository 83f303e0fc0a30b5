"""Who is calling: an API key from the tenant map, or a tenant header from a trusted source.

A client can only be charged as the tenant its own key belongs to. The tenant header is
honoured only when the TCP peer is a configured trusted source (the gateway in front of the
proxy); from anyone else it is ignored, so a client cannot bill its usage to another tenant.
The reserved names (``unknown``, ``other`` and the probe tenant ``_probe``, whose tokens cost
nothing) are never honoured from the header, whoever sends it: a gateway that forwards client
headers must not let a client claim them. Such a request is resolved by its API key alone,
and refused without one; the probe runner is charged as ``_probe`` through an API key mapped
to that tenant.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

from inferwatch.proxy.config import (
    HEADER_RESERVED_TENANTS,
    TENANT_PATTERN,
    ProxyConfig,
)
from inferwatch.serving.fastpath import remember

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Resolution:
    """A tenant, or a rejection (``tenant is None``) with the reason to tell the client."""

    tenant: str | None
    via: str  # key | header | unknown | rejected
    reason: str = ""


def hash_key(key: str | bytes) -> str:
    """The SHA-256 hex digest under which a tenant's API key is configured."""
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


class TenantResolver:
    def __init__(self, config: ProxyConfig) -> None:
        self._keys = config.key_index
        self._header = config.tenant_header.encode()
        self._trusted = config.trusted_sources
        self._attribute_unknown = config.unknown_policy == "attribute"
        self._trusted_memo: dict[str, bool] = {}

    def is_trusted(self, host: str) -> bool:
        """Whether a peer address is a trusted source (memoised: peers repeat)."""
        known = self._trusted_memo.get(host)
        if known is None:
            known = remember(self._trusted_memo, host, self._is_trusted(host), 1024)
        return known

    def _is_trusted(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._trusted)

    def resolve(self, headers: list[tuple[bytes, bytes]], peer: str | None) -> Resolution:
        authorization = header_tenant = None
        for name, value in headers:
            if name == b"authorization":
                authorization = value
            elif name == self._header:
                header_tenant = value
        if (
            header_tenant is not None
            and peer is not None
            and self._trusted
            and self.is_trusted(peer)
        ):
            tenant = header_tenant.decode("latin-1").strip()
            if tenant in HEADER_RESERVED_TENANTS:
                reserved = f"the tenant header names the reserved tenant {tenant!r}"
            elif TENANT_PATTERN.match(tenant):
                return Resolution(tenant, "header")
            else:
                return Resolution(None, "rejected", "tenant header value is not a valid tenant id")
        else:
            reserved = ""
        if authorization is not None:
            scheme, _, key = authorization.partition(b" ")
            if scheme.lower() == b"bearer" and key.strip():
                owner = self._keys.get(hash_key(key.strip()))
                if owner is not None:
                    return Resolution(owner, "key")
                return self._unknown(reserved or "API key is not known")
        if reserved:  # a reserved name is never honoured, nor attributed to `unknown`
            return Resolution(None, "rejected", reserved)
        return self._unknown("no API key (Authorization: Bearer ...)")

    def _unknown(self, reason: str) -> Resolution:
        if self._attribute_unknown:
            return Resolution(UNKNOWN, "unknown", reason)
        return Resolution(None, "rejected", reason)
