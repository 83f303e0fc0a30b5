"""Who is calling: an API key from the tenant map, or a tenant header from a trusted source.

A valid API key always decides: a client can only be charged as the tenant its own key
belongs to, whatever headers it adds. Without one, the tenant header is honoured only when
the TCP peer is a configured trusted source (the gateway in front of the proxy, which removes
a client's own copy and sets the header itself); from anyone else it is ignored, so a client
cannot bill its usage to another tenant. The reserved names (``unknown``, ``other`` and the
probe tenant ``_probe``, whose tokens cost nothing) are never honoured from the header: such a
request is refused unless its key names a tenant; the probe runner is charged as ``_probe``
through an API key mapped to that tenant.

The other headers a gateway sets (the canary split, the versions) follow the same rule once
trusted sources are configured; with none configured there is no gateway to tell apart, and
they are taken from whoever sends them (see docs/trust.md).
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

    def from_gateway(self, peer: str | None) -> bool:
        """Whether the split and version headers of a request from ``peer`` are honoured."""
        return not self._trusted or (peer is not None and self.is_trusted(peer))

    def resolve(self, headers: list[tuple[bytes, bytes]], peer: str | None) -> Resolution:
        authorization = header_tenant = None
        for name, value in headers:
            if name == b"authorization":
                authorization = value
            elif name == self._header:
                header_tenant = value
        keyed = False
        if authorization is not None:
            scheme, _, key = authorization.partition(b" ")
            if scheme.lower() == b"bearer" and key.strip():
                keyed = True
                owner = self._keys.get(hash_key(key.strip()))
                if owner is not None:
                    return Resolution(owner, "key")  # a valid key wins over any header
        if (
            header_tenant is not None
            and peer is not None
            and self._trusted
            and self.is_trusted(peer)
        ):
            tenant = header_tenant.decode("latin-1").strip()
            if tenant in HEADER_RESERVED_TENANTS:
                # never honoured, nor attributed to `unknown`
                return Resolution(
                    None, "rejected", f"the tenant header names the reserved tenant {tenant!r}"
                )
            if TENANT_PATTERN.match(tenant):
                return Resolution(tenant, "header")
            return Resolution(None, "rejected", "tenant header value is not a valid tenant id")
        if keyed:
            return self._unknown("API key is not known")
        return self._unknown("no API key (Authorization: Bearer ...)")

    def _unknown(self, reason: str) -> Resolution:
        if self._attribute_unknown:
            return Resolution(UNKNOWN, "unknown", reason)
        return Resolution(None, "rejected", reason)
