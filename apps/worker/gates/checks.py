"""`manage.py check` (and every worker start) names what is wrong with the forge credentials the worker
acts with, and with its secret resolvers, before a job finds out."""

import os

from django.conf import settings
from django.core.checks import Error, register
from django.core.checks import Warning as CheckWarning
from django.core.exceptions import ImproperlyConfigured

from apps.fleet.capabilities import parse_profiles
from apps.worker.forges import github_app_problem


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


@register()
def egress_settings(app_configs, **kwargs):
    """The gateway's upstream, allowlist and prices: a mistake here would fail every job, so it fails start."""
    from urllib.parse import urlsplit

    from apps.worker import known_models
    from apps.worker.sandbox import prices, providers
    from apps.worker.sandbox.egress_policy import PolicyError, parse_allowlist

    found = []
    try:
        parse_allowlist(settings.PI_EGRESS_ALLOW)
    except PolicyError as error:
        found.append(Error(str(error), hint="A comma-separated list like registry.npmjs.org:443,pypi.org:443.",
                           id="worker.E004"))
    base_url = settings.PI_PROVIDER_BASE_URL
    if base_url:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            found.append(Error(f"PI_PROVIDER_BASE_URL {base_url!r} is not an http(s) URL without query.",
                               hint="e.g. https://llm.example.com/v1", id="worker.E005"))
    if settings.PI_PROVIDER_API and settings.PI_PROVIDER_API not in providers.METERED_APIS:
        found.append(Error(f"PI_PROVIDER_API {settings.PI_PROVIDER_API!r} is not one the gateway can meter.",
                           hint=f"One of {', '.join(providers.METERED_APIS)}.", id="worker.E006"))
    provider = settings.PI_PROVIDER
    if provider not in providers.builtin_providers():
        missing = [name for name, value in (("PI_PROVIDER_BASE_URL", base_url),
                                            ("PI_PROVIDER_API", settings.PI_PROVIDER_API),
                                            ("PI_MODEL", settings.PI_MODEL)) if not value]
        if not providers.key_variable(provider):
            missing.append(f"PI_PROVIDER_KEY_VARS ({provider}:<VARIABLE>)")
        if missing:
            found.append(Error(f"PI_PROVIDER {provider!r} is not one of pi's built-in providers, so its endpoint must "
                               f"be configured: set {', '.join(missing)}.", id="worker.E007"))
    if settings.PI_MODEL_PRICES:
        try:
            prices.price("-", "-")
        except ImproperlyConfigured as error:
            found.append(Error(str(error), id="worker.E008"))
    found.extend(_allowed_models_problems())
    unpriced = None if any(error.id == "worker.E008" for error in found) else known_models.deployment_warning()
    if unpriced:
        found.append(CheckWarning(unpriced, hint="Price it in PI_MODEL_PRICES, or pick a model pi prices.",
                                  id="worker.W005"))
    return found


def _allowed_models_problems() -> list[Error]:
    """PI_ALLOWED_MODELS: well formed, and naming the deployment's own model when PI_MODEL is set (else every job
    without a model of its own would be refused model-not-allowed)."""
    from apps.worker import allowed_models

    try:
        listed = allowed_models.deployment_list()
    except allowed_models.ModelListError as error:
        return [Error(str(error), id="worker.E013")]
    problem = allowed_models.main_model_problem(settings.PI_PROVIDER, settings.PI_MODEL, listed, "PI_ALLOWED_MODELS")
    return [Error(problem, hint="PI_MODEL and PI_PROVIDER name the main model.", id="worker.E014")] if problem else []


# Settings a value out of range would turn upside down (a negative disk limit would stop every job): the
# least each may be.
BOUNDS = {"PI_JOB_DISK_MB": 0, "PI_JOB_MAX_FILES": 0, "PI_JOB_TMP_MB": 1, "PI_JOB_HOME_MB": 1,
          "PI_JOB_DISK_POLL_SECONDS": 0.1, "PI_REDIS_OUTAGE_SECONDS": 0, "PI_LOST_RETRIES": 0,
          "PI_DATABASE_RECHECK_SECONDS": 1, "PI_WAIT_CHECK_SLOTS": 1, "PI_WAIT_THROTTLE_SECONDS": 0.1,
          "PI_JOB_LOG_MAX_BYTES": 1024, "PI_JOB_LOG_RETENTION_DAYS": 1, "PI_GATEWAY_CALLS_IN_FLIGHT": 1,
          "PI_GATEWAY_MAX_REQUEST_MB": 1, "PI_RUN_RETENTION_DAYS": 1,
          # A forge's redelivery of a delivery whose row is gone is caught by its body's replay claim for
          # PI_REPLAY_WINDOW_SECONDS (7 days), so the inbox keeps rows at least that long.
          "PI_DELIVERY_RETENTION_DAYS": 7}


@register()
def bounds_settings(app_configs, **kwargs):
    return [Error(f"{name} must be at least {least}, not {getattr(settings, name)}.",
                  hint="Unset it for the default.", id="worker.E009")
            for name, least in BOUNDS.items() if getattr(settings, name) < least]


@register()
def dollar_settings(app_configs, **kwargs):
    """A dollar window without a per-job cap could not bound a run: `manage.py check` and every process's start
    (the worker's and cron's commands run the checks; the web server calls require_dollar_settings) refuse it."""
    from apps.worker.gates.runtime_settings import environment_dollars

    try:
        dollars = environment_dollars()
    except ImproperlyConfigured as error:
        return [Error(str(error), id="worker.E010")]
    per_job = dollars["max_cost_usd"]
    return [CheckWarning(f"{variable} is smaller than PI_MAX_COST_USD: every run holds its cap first, so every job "
                         "would be refused dollar-cap (unless the settings row lowers the per-run cap).",
                         id="worker.W002")
            for name, variable in (("daily_cost_usd", "PI_DAILY_COST_USD"), ("weekly_cost_usd", "PI_WEEKLY_COST_USD"),
                                   ("monthly_cost_usd", "PI_MONTHLY_COST_USD"))
            if dollars[name] is not None and per_job is not None and dollars[name] < per_job]


def require_dollar_settings() -> None:
    """For a process that runs no system checks (gunicorn's): the same refusal, at import."""
    from apps.worker.gates.runtime_settings import environment_dollars

    environment_dollars()


@register()
def publishing_settings(app_configs, **kwargs):
    """The heap bound of the git that reads the agent's work is util-linux's prlimit: without it, no bound. The
    workspace volume's setting is one of its choices (a typo would quietly mean `auto`)."""
    from apps.worker.sandbox import workspace_volume
    from apps.worker.sandbox.gitrun import PRLIMIT

    if settings.PI_JOB_WORKSPACE_VOLUME not in workspace_volume.CHOICES:
        return [Error(f"PI_JOB_WORKSPACE_VOLUME={settings.PI_JOB_WORKSPACE_VOLUME!r} is not one of "
                      f"{', '.join(workspace_volume.CHOICES)}.", id="worker.E016")]
    if settings.PI_PUBLISH_GIT_MEMORY_MB and not PRLIMIT:
        return [CheckWarning("PI_PUBLISH_GIT_MEMORY_MB cannot bound git's heap: this host has no prlimit "
                             "(util-linux).", hint="Install util-linux, or set PI_PUBLISH_GIT_MEMORY_MB=0 to say so.",
                             id="worker.W006")]
    return []


@register()
def failure_hook_settings(app_configs, **kwargs):
    """PI_ON_FAILURE is an absolute executable: a relative one would depend on the folder the worker started in."""
    hook = settings.PI_ON_FAILURE
    found = []
    if hook and not os.path.isabs(hook):
        found.append(Error(f"PI_ON_FAILURE={hook!r} is not an absolute path.",
                           hint="Name the executable by its full path, or unset it.", id="worker.E011"))
    elif hook and not (os.path.isfile(hook) and os.access(hook, os.X_OK)):
        found.append(CheckWarning(f"PI_ON_FAILURE={hook!r} is not an executable file on this host; the failure hook "
                                  "will not run (failure_hook_ran result=spawn-failed).", id="worker.W003"))
    if settings.PI_ON_FAILURE_TIMEOUT_MS < 1 or settings.PI_CHAIN_MAX_PER_JOB < 0 or settings.PI_CHAIN_DEPTH_MAX < 0:
        found.append(Error("PI_ON_FAILURE_TIMEOUT_MS must be at least 1, PI_CHAIN_MAX_PER_JOB and PI_CHAIN_DEPTH_MAX "
                           "at least 0.", hint="Unset them for the defaults.", id="worker.E012"))
    return found


@register()
def overlay_and_venue_settings(app_configs, **kwargs):
    """An overlay that is not there would run every job without it, quietly; a venue nobody knows is a typo."""
    from apps.worker.sandbox import venues

    found = []
    overlay = settings.PI_GLOBAL_PI_DIR
    if overlay and not (os.path.isabs(overlay) and os.path.isdir(overlay)):
        found.append(CheckWarning(f"PI_GLOBAL_PI_DIR={overlay!r} is not an absolute folder on this host; jobs here run "
                                  "without the overlay.", hint="Create it (`manage.py import_pi`), or unset it.",
                                  id="worker.W004"))
    unknown = [name for name in settings.PI_BACKENDS if name not in venues.VENUES]
    if unknown:
        found.append(Error(f"PI_BACKENDS names unknown venues: {', '.join(unknown)}.",
                           hint=f"Known: {', '.join(venues.VENUES)}.", id="worker.E015"))
    return found
