"""Where a notification may go: a public address, or a host PI_NOTIFY_INTERNAL_HOSTS names.

An endpoint's URL is judged when it is saved and again at each try, by every address its name resolves to then
(a name can resolve elsewhere later), and the try connects to the address it judged, never resolving the name a
second time, and follows no redirect. So no endpoint reaches this host's own services (Redis, the database, the
admin), the network it sits in, or a cloud's metadata service (169.254.169.254), and no refused try tells the
operator's admin which internal ports answer.

Refused unless named: loopback, private (RFC 1918, IPv6 unique-local), link-local, carrier-grade NAT, multicast,
reserved and unspecified addresses, and IPv6 forms that carry one of those (IPv4-mapped, 6to4, Teredo). A URL with
a user name or password is refused too (a signing secret is the endpoint's credential), as is any scheme but http
and https.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

DEFAULT_PORTS = {"http": 80, "https": 443}


class DestinationRefused(Exception):
    """The URL may not be notified: `reason` is a token for the try's record, the message says why and what to do."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Destination:
    """A judged URL: the address a try connects to, and the name it says it is talking to (Host, TLS)."""

    scheme: str
    host: str
    port: int
    address: str
    target: str  # the path and query, as the request line carries them

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == DEFAULT_PORTS[self.scheme] else f"{name}:{self.port}"


def _allowed_internal() -> tuple[set[str], list]:
    """PI_NOTIFY_INTERNAL_HOSTS: host names (as the URL spells them) and addresses or networks."""
    names, networks = set(), []
    for entry in settings.PI_NOTIFY_INTERNAL_HOSTS:
        try:
            networks.append(ipaddress.ip_network(entry.strip().strip("[]"), strict=False))
        except ValueError:
            names.add(entry.strip().lower().rstrip("."))
    return names, networks


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if address.version == 6:
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if embedded is not None and not is_public(embedded):
            return False
    return address.is_global and not address.is_multicast


def judge(url: str) -> Destination:
    """The URL's destination, resolved now, or DestinationRefused."""
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").rstrip("."), parts.port
    except ValueError:
        raise DestinationRefused("url-malformed", "The URL cannot be read.") from None
    if parts.scheme not in DEFAULT_PORTS or not host:
        raise DestinationRefused("url-malformed", "Only http:// and https:// URLs with a host can be notified.")
    if parts.username is not None or parts.password is not None:
        raise DestinationRefused("url-credentials", "The URL holds a user name or password: drop it, and sign "
                                                    "the requests with a signing secret instead.")
    port = port or DEFAULT_PORTS[parts.scheme]
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise DestinationRefused("unresolvable", f"{host} does not resolve from this host.") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(entry[4][0].split("%", 1)[0]) for entry in found))
    names, networks = _allowed_internal()
    named = host.lower() in names
    for address in addresses:
        if not is_public(address) and not named and not any(address in network for network in networks):
            raise DestinationRefused(
                "internal-address",
                f"{host} is (or resolves to) an internal address, which notifications do not reach: loopback, a "
                f"private or link-local network, a cloud metadata service. Name it in PI_NOTIFY_INTERNAL_HOSTS "
                f"(the web's and the notify worker's environment) if it is meant to be reached.")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(parts.scheme, host, port, str(addresses[0]), target)
