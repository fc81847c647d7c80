"""The one SSRF guard: which URLs the platform may connect to on a tenant's behalf (webhooks, MCP servers).

A URL is accepted when it is http(s), carries no credentials, and every address its host resolves to
is *global* — ``ipaddress``'s ``is_global`` (which already refuses loopback, RFC 1918, link-local,
shared address space 100.64/10, benchmarking, documentation and reserved ranges), not multicast, not
a transition prefix that ``is_global`` lets through (6to4 2002::/16, NAT64 64:ff9b::/96 and its
local-use 64:ff9b:1::/48: where they lead is a relay's choice), and for an IPv4-mapped or Teredo
address the carried IPv4 address global too. ``allow_private`` (an operator's
switch for one-user installs) skips the address test, never the rest.

Checking once is not enough: a name can answer a public address at the check and 127.0.0.1 a second
later (DNS rebinding). So every connection is made to an address checked *for that connection*:
:func:`check_url` resolves and checks, :func:`pinned` rewrites the request to go to that address while
``Host`` and the TLS server name keep the URL's host (the certificate is checked against the name).
Callers resolve again for every connection — registration, refresh, each call, each delivery.

Errors: :class:`UrlRefusedError` (a ``ValueError``) with ``reason`` ``invalid`` | ``unresolved`` |
``not_public`` and ``details`` for the caller's own typed error.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["MAX_URL_CHARS", "Resolver", "UrlRefusedError", "check_host", "check_url", "is_public", "pinned",
           "resolve_host"]

#: Longest URL accepted.
MAX_URL_CHARS = 2048
#: ``resolve(host, port) -> addresses``: what the guard resolves with (tests pass a double).
Resolver = Callable[[str, int], list[str]]

#: IPv6 ranges that reach IPv4 through a translator (NAT64 well-known and local-use prefixes); 6to4 is tested apart.
_TRANSLATED = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class UrlRefusedError(ValueError):
    """A URL the guard refuses; ``reason`` says why (``invalid``, ``unresolved``, ``not_public``)."""

    def __init__(self, message: str, *, reason: str, **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.details = {"reason": reason, **details}


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order (an IP literal resolves to itself)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-mapped or Teredo), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def is_public(address: str) -> bool:
    """A globally routable unicast address that is not a transition prefix, and so is any IPv4 address it carries."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.sixtofour is not None or any(ip in net for net in _TRANSLATED):
            return False  # ``is_global`` says yes; a relay or gateway decides where it goes, not the address
        inner = _embedded_v4(ip)
        if inner is not None and not is_public(str(inner)):
            return False
    return ip.is_global and not ip.is_multicast


def check_host(host: str, port: int, *, allow_private: bool, resolve: Resolver | None = None) -> list[str]:
    """The addresses ``host`` resolves to, every one of them public unless ``allow_private``; else refused."""
    try:
        addresses = (resolve or resolve_host)(host, port)
    except (OSError, UnicodeError) as exc:
        raise UrlRefusedError(f"the host {host} does not resolve: {exc}", reason="unresolved", host=host) from None
    if not addresses:
        raise UrlRefusedError(f"the host {host} resolves to no address", reason="unresolved", host=host)
    if not allow_private:
        refused = [a for a in addresses if not is_public(a)]
        if refused:
            raise UrlRefusedError(f"the host {host} resolves to {refused[0]}, a loopback, private, link-local or "
                                  "otherwise non-public address", reason="not_public", host=host, address=refused[0])
    return addresses


def check_url(url: str, *, allow_private: bool, resolve: Resolver | None = None) -> tuple[httpx.URL, list[str]]:
    """The parsed URL (no fragment) and its host's checked addresses, or :class:`UrlRefusedError`."""
    if not isinstance(url, str) or not url.strip():
        raise UrlRefusedError("the URL is empty", reason="invalid")
    if len(url) > MAX_URL_CHARS:
        raise UrlRefusedError(f"the URL is longer than {MAX_URL_CHARS} characters", reason="invalid", length=len(url))
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url.strip()):
        raise UrlRefusedError("the URL contains whitespace or control characters", reason="invalid", url=url[:200])
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise UrlRefusedError(f"the URL cannot be parsed: {exc}", reason="invalid", url=url[:200]) from None
    if parsed.scheme not in ("http", "https"):
        raise UrlRefusedError(f"the URL must be http or https, not {parsed.scheme or 'scheme-less'}", reason="invalid",
                              url=url[:200], scheme=parsed.scheme)
    if not parsed.host:
        raise UrlRefusedError("the URL has no host", reason="invalid", url=url[:200])
    if parsed.userinfo:
        raise UrlRefusedError("the URL may not carry credentials (user:password@)", reason="invalid", url=parsed.host)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = check_host(parsed.raw_host.decode("ascii"), port, allow_private=allow_private, resolve=resolve)
    return parsed.copy_with(fragment=None), addresses


def pinned(url: Any, address: str) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """``url`` sent to ``address``: (the rewritten URL, the ``Host`` header, the request extensions).

    ``url`` is an ``httpx.URL`` (or the same type of the SDK's ``httpx2``). ``Host`` keeps the URL's
    host and port; for https the TLS server name (and so the certificate check) is the URL's host.
    """
    host = url.raw_host.decode("ascii") if isinstance(url.raw_host, bytes) else str(url.raw_host)
    extensions = {"sni_hostname": host} if url.scheme == "https" else {}
    netloc = url.netloc.decode("ascii") if isinstance(url.netloc, bytes) else str(url.netloc)
    return url.copy_with(host=address), {"Host": netloc}, extensions
