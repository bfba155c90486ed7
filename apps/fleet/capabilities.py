"""Host capabilities: the named profiles a worker host declares (`name:/abs/path,...` settings).

Only the names ever leave the host (registry rows, routing); the paths stay in this host's settings.
"""

import re

from django.core.exceptions import ImproperlyConfigured

PROFILE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def parse_profiles(value: str, setting: str) -> dict[str, str]:
    """`name:/abs/path,name2:/abs/path2` -> {name: path}; a malformed entry refuses to start."""
    profiles: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in (value or "").split(","))):
        name, sep, path = entry.partition(":")
        if not sep or not PROFILE_NAME.fullmatch(name) or not path.startswith("/"):
            raise ImproperlyConfigured(
                f"{setting}: {entry.split(':', 1)[0]!r} is not `name:/absolute/path` (name of letters, digits, . _ -)."
            )
        if name in profiles:
            raise ImproperlyConfigured(f"{setting}: profile {name!r} is declared twice.")
        profiles[name] = path
    return profiles


def declared_capabilities(settings) -> list[str]:
    """The capability names this host offers, as routing and the registry spell them."""
    waits = parse_profiles(settings.PI_WAIT_PROFILES, "PI_WAIT_PROFILES")
    secrets = parse_profiles(settings.PI_SECRET_PROFILES, "PI_SECRET_PROFILES")
    return sorted([f"wait:{name}" for name in waits] + [f"secrets:{name}" for name in secrets])
