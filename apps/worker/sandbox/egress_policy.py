"""Where a job may connect besides its provider: `PI_EGRESS_ALLOW=host:port,...` (nothing by default).

A request is matched on exactly the host and port the client asked for, before any name is resolved or
socket opened: `registry.npmjs.org:443` allows that name on that port, not its addresses, not other ports.
"""

from __future__ import annotations

import ipaddress
import re

HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$")
LOG_SAFE = re.compile(r"[^a-z0-9.:\[\]-]")


class PolicyError(ValueError):
    """A malformed allowlist entry; the message names it."""


def split_authority(authority: str, default_port: int | None = None) -> tuple[str, int] | None:
    """`host:port` (IPv6 in brackets) as (lowercased host, port); None when it is not one."""
    authority = authority.strip()
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[1:end], authority[end + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:]
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
        host = host.lower()
        if not HOSTNAME.fullmatch(host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                return None
    if not port_text:
        if default_port is None:
            return None
        return host.lower(), default_port
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        return None
    return host.lower(), int(port_text)


def parse_allowlist(value: str) -> frozenset[tuple[str, int]]:
    entries = set()
    for raw in filter(None, (part.strip() for part in (value or "").split(","))):
        entry = split_authority(raw)
        if entry is None:
            raise PolicyError(f"PI_EGRESS_ALLOW: {raw!r} is not host:port (a name or an IP address, and a port "
                              "1-65535; IPv6 in brackets)")
        entries.add(entry)
    return frozenset(entries)


def log_safe(host: str, port: int) -> str:
    """A host:port the agent chose, fit for a log line (no spaces, no `=`, bounded)."""
    return f"{LOG_SAFE.sub('?', host.lower())[:80]}:{port}"
