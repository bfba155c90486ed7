"""`manage.py check` (and every worker start) names what is wrong with the forge credentials the worker
acts with, and with its secret resolvers, before a job finds out."""

import os

from django.conf import settings
from django.core.checks import Error, Warning as CheckWarning, register
from django.core.exceptions import ImproperlyConfigured

from apps.fleet.capabilities import parse_profiles

from .forges import github_app_problem


@register()
def github_app_settings(app_configs, **kwargs):
    problem = github_app_problem()
    if not problem:
        return []
    return [Error(f"GitHub App: {problem}.", hint="Complete GITHUB_APP_ID, GITHUB_APP_INSTALLATION_ID and "
                  "GITHUB_APP_PRIVATE_KEY (or GITHUB_APP_PRIVATE_KEY_PATH), or unset GITHUB_APP_ID to use "
                  "GITHUB_TOKEN.", id="worker.E001")]


@register()
def secret_resolver_settings(app_configs, **kwargs):
    """A resolver that cannot run makes every job that needs it retry and fail: say so at start."""
    found = []
    if settings.PI_SECRET_RESOLVE_TIMEOUT_MS < 1:
        found.append(Error("PI_SECRET_RESOLVE_TIMEOUT_MS must be at least 1 (milliseconds).",
                           hint="Unset it for the default of 10000.", id="worker.E002"))
    try:
        profiles = parse_profiles(settings.PI_SECRET_PROFILES, "PI_SECRET_PROFILES")
    except ImproperlyConfigured as error:
        return [*found, Error(str(error), id="worker.E003")]
    for name, path in profiles.items():
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            found.append(CheckWarning(
                f"PI_SECRET_PROFILES: the resolver of profile {name!r} is not an executable file on this host; "
                "jobs needing it will retry and fail (secret-resolver-unreachable).",
                hint="Install the resolver at the declared path and make it executable.", id="worker.W001"))
    return found
