"""Which addresses a registry client dials when a tenant names the host.

A Module names its image's registry host; the operator dials it, and then
whatever realm and redirect that host answers with. Without a rule, a
Module could point the operator at the node's own services (loopback) or at
the cloud's instance metadata (link-local ``169.254.169.254``), which
answer the operator's identity and credentials. So ``Guard`` refuses:

- loopback: ``127.0.0.0/8``, ``::1``;
- link-local: ``169.254.0.0/16`` (every cloud's metadata address among
  them), ``fe80::/10``;
- "this host": ``0.0.0.0/8`` and ``::`` (Linux connects those to itself);
- the IPv6 forms of those IPv4 addresses: v4-mapped ``::ffff:a.b.c.d``,
  the deprecated v4-compatible ``::/96``, NAT64's ``64:ff9b::/96``;
- AWS's IPv6 metadata address ``fd00:ec2::254`` (not link-local).

Private networks (10/8, 172.16/12, 192.168/16, fc00::/7) stay allowed:
in-cluster registries live there, and a Module's author can run pods there
anyway.

The address checked is the one dialled: names are resolved once by the
resolver the client's connector uses (``resolver``), which drops refused
addresses before aiohttp connects to what is left (an IP literal is never
resolved: ``check_literal`` judges it before the request). A name that
resolves to refused addresses only is ``Refused``; DNS rebinding between a
check and a connect cannot happen, because there is no second resolution.

``trusted`` are the (host, port) pairs of the operator's own
``--registry-endpoint`` flags, dialled whatever they resolve to (the sandbox
reaches its registry on loopback through one).

Limits: a proxy is never used (the client does not read the environment).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Iterable

import aiohttp
from aiohttp import abc
from yarl import URL

__all__ = ["Guard", "Refused", "refusal", "trusted_pairs"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_THIS_HOST = ipaddress.ip_network("0.0.0.0/8")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = frozenset({ipaddress.ip_address("fd00:ec2::254")})


class Refused(OSError):
    """A destination the guard does not dial; ``reason`` names the rule."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: {reason} addresses are not dialled")
        self.host = host
        self.reason = reason


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _V4_COMPATIBLE or address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal(address: Address) -> str | None:
    """Why ``address`` is not dialled ("loopback", "link-local", ...), or None."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _METADATA:
            return "cloud metadata"
        if address == ipaddress.IPv6Address("::"):
            return "unspecified"
        if address.is_loopback:
            return "loopback"
        embedded = _embedded_v4(address)
        if embedded is not None:
            found = refusal(embedded)
            # The v4-compatible range is deprecated: nothing routes it to a
            # registry, so every address of it is refused.
            if found is None and address in _V4_COMPATIBLE:
                return "IPv4-compatible IPv6"
            return found
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if isinstance(address, ipaddress.IPv4Address) and address in _THIS_HOST:
        return "unspecified"
    return None


def _parse(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def trusted_pairs(endpoints: Iterable[str]) -> frozenset[tuple[str, int | None]]:
    """``host[:port]`` endpoints as (host, port) pairs (port None: any)."""
    found: set[tuple[str, int | None]] = set()
    for endpoint in endpoints:
        url = URL(f"//{endpoint}")
        host = (url.host or "").lower()
        found.add((host, url.explicit_port))
    return frozenset(found)


@dataclasses.dataclass(frozen=True)
class Guard:
    """The destinations rule; ``trusted``: (host, port) pairs dialled as they are."""

    trusted: frozenset[tuple[str, int | None]] = frozenset()

    def is_trusted(self, host: str, port: int | None) -> bool:
        host = host.lower().strip("[]")
        return (host, port) in self.trusted or (host, None) in self.trusted

    def check_literal(self, host: str, port: int | None) -> None:
        """Refused when ``host`` is an IP address the rule refuses (a name
        is judged by ``resolver`` once resolved)."""
        address = _parse(host)
        if address is None or self.is_trusted(host, port):
            return
        reason = refusal(address)
        if reason is not None:
            raise Refused(host, reason)

    def resolver(self) -> abc.AbstractResolver:
        """A resolver (for ``aiohttp.TCPConnector``) that keeps only the
        addresses the rule allows; create it inside the event loop."""
        return _Resolver(self)


class _Resolver(abc.AbstractResolver):
    def __init__(self, guard: Guard) -> None:
        self._guard = guard
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[abc.ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if self._guard.is_trusted(host, port):
            return found
        kept: list[abc.ResolveResult] = []
        reasons: list[str] = []
        for result in found:
            address = _parse(result["host"])
            reason = refusal(address) if address is not None else "unparsable"
            if reason is None:
                kept.append(result)
            else:
                reasons.append(reason)
        if not kept:
            raise Refused(host, reasons[0] if reasons else "unresolved")
        return kept

    async def close(self) -> None:
        await self._inner.close()
