"""`manage.py doctor`: what works on this worker host and what to do about what does not, one line per check.

Each finding is ok / warn / FAIL, the check's name, what was found and, when it is not ok, what to do next.
A job could run here when nothing FAILs (warnings allowed): the command's exit code says that. The other live
hosts of the fleet are listed as their registry rows last reported them (apps/fleet/registry.py): the doctor
cannot look inside another machine, so it compares what they publish with this host.

Never a secret in a finding: keys, tokens and webhook secrets are "set" or "not set" and their length; URLs
lose their user and password. `live=True` also makes one cheap provider call through a real egress gateway
(a few tokens, metered but not counted in the day's tokens: they are no job's) and asks each configured forge's
API who its token is.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

from apps import forge_registry

OK, WARN, FAIL = "ok", "warn", "FAIL"
GITHUB_BROAD_SCOPES = ("workflow", "admin:org", "admin:repo_hook", "admin:org_hook", "delete_repo",
                       "admin:enterprise", "site_admin", "write:packages", "delete:packages")
GITLAB_BROAD_SCOPES = ("sudo", "admin_mode")


@dataclass
class Finding:
    status: str
    check: str
    finding: str
    todo: str = ""


@dataclass
class HostReport:
    name: str
    this_host: bool
    note: str = ""
    findings: list[Finding] = field(default_factory=list)

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def warned(self) -> list[Finding]:
        return [f for f in self.findings if f.status == WARN]


def safe_url(url: str) -> str:
    """A URL without its user and password (a Redis or database URL may carry one)."""
    parts = urlsplit(url)
    if not parts.scheme or ("@" not in parts.netloc and not parts.query):
        return url  # nothing to hide (and unix:///path stays as it is)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def processes(count: int) -> str:
    return f"{count} worker process" + ("" if count == 1 else "es")


def secret_state(name: str, value: str) -> str:
    """How a finding speaks of a secret: whether it is set, and how long it is. Never any of it."""
    value = (value or "").strip()
    return f"{name} set ({len(value)} chars)" if value else f"{name} not set"


# --- the checks of this host ---------------------------------------------------------------------------

def check_database() -> list[Finding]:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    engine = connection.vendor
    where = connection.settings_dict.get("NAME") if engine == "sqlite" else connection.settings_dict.get("HOST")
    try:
        connection.ensure_connection()
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as error:  # any driver error: the database does not answer
        return [Finding(FAIL, "database", f"{engine} at {where} does not answer ({type(error).__name__})",
                        "start the database, or fix DATABASE_URL (every run is recorded there)")]
    if pending:
        return [Finding(FAIL, "database", f"{engine} at {where}: {len(pending)} migrations not applied",
                        "python manage.py migrate")]
    return [Finding(OK, "database", f"{engine} at {where}, migrations applied")]


def check_redis(redis) -> list[Finding]:
    from redis.exceptions import RedisError, ResponseError

    from apps.fleet import topology
    from apps.fleet.connection import where

    try:
        redis.ping()
        version = (redis.info("server") or {}).get("redis_version", "?")
        layout = topology.read(redis)
    except RedisError as error:
        return [Finding(FAIL, "redis", f"no answer at {where()} ({type(error).__name__})",
                        "start Redis, or set REDIS_URL (REDIS_SENTINELS behind Sentinel) to the fleet's Redis "
                        "(jobs wait there)")]
    found = [Finding(OK, "redis", f"Redis {version} at {where()}: {layout.summary()}")]
    found += [Finding(WARN, "redis-replicas", warning, "see docs/deploying.md, Redis Sentinel: at least one replica "
                      "and three sentinels on three hosts") for warning in layout.warnings()]
    try:
        appendonly = redis.config_get("appendonly").get("appendonly", "")
        appendfsync = redis.config_get("appendfsync").get("appendfsync", "")
    except ResponseError:  # managed Redis often disables CONFIG
        return found + [Finding(WARN, "redis-aof", "CONFIG GET is refused, so its persistence cannot be read",
                                "make sure it runs with appendonly yes and appendfsync always: a queued "
                                "delivery's job is its only copy")]
    if appendonly != "yes":
        found.append(Finding(WARN, "redis-aof", "appendonly no: a killed Redis loses every job queued since "
                             "its last snapshot", "redis-cli CONFIG SET appendonly yes; CONFIG SET appendfsync "
                             "always (and the same in redis.conf)"))
    elif appendfsync != "always":
        found.append(Finding(WARN, "redis-aof", f"appendonly yes, appendfsync {appendfsync}: a power cut can lose "
                             "the jobs queued in its last second", "redis-cli CONFIG SET appendfsync always "
                             "(and in redis.conf)"))
    else:
        found.append(Finding(OK, "redis-aof", "appendonly yes, appendfsync always: a queued job is on disk"))
    return found


def check_engine() -> tuple[list[Finding], object | None]:
    from apps.worker.sandbox.container import engine

    where = safe_url(os.environ.get("DOCKER_HOST", "")) or "the default socket"
    try:
        client = engine()
        client.ping()
        info = client.info()
    except Exception as error:  # docker raises many kinds; all mean "no engine here"
        return [Finding(FAIL, "docker", f"no Docker engine answers at {where} ({type(error).__name__})",
                        "start dockerd, or set DOCKER_HOST to this host's engine (every job is a container)")], None
    driver = info.get("Driver", "?")
    found = [Finding(OK, "docker", f"Docker {info.get('ServerVersion', '?')} at {where}")]
    if driver == "vfs":
        found.append(Finding(WARN, "docker-storage", "storage driver vfs: every job container copies its whole "
                             "image (seconds per job)", "run the engine with overlay2 on ext4 or xfs "
                             "(see DEVELOPERS.md, the private Docker engine)"))
    else:
        found.append(Finding(OK, "docker-storage", f"storage driver {driver}"))
    return found, client


def check_host_budget() -> list[Finding]:
    """The host budget the workers here start with (a budget below one default job stops them at start)."""
    from apps.worker.gates import host_budget

    try:
        budget = host_budget.compute_budget()
    except host_budget.BudgetInvalid as error:
        return [Finding(FAIL, "host-budget", str(error), "fix PI_HOST_MEMORY_BUDGET / PI_HOST_CPU_BUDGET or the "
                        "job size: the workers refuse to start")]
    memory = "off" if budget.memory_mib is None else f"{budget.memory_mib} MiB"
    cpus = "off" if budget.cpu_centi is None else f"{budget.cpu_centi / 100:g} CPUs"
    engine = (f" (the engine reports {budget.engine_memory_mib} MiB, {budget.engine_cpu_centi / 100:g} CPUs)"
              if budget.engine_memory_mib else "")
    size = host_budget.default_size()
    return [Finding(OK, "host-budget", f"memory {memory}, {cpus}{engine}; a default job is {size.memory_mib} MiB, "
                    f"{size.cpus:g} CPUs")]


def check_limits() -> list[Finding]:
    """Scoped limits whose dollar windows no per-run cap backs (an ancestor's file imports so)."""
    from apps.worker.validators import uncapped_dollar_rows, uncapped_dollars_warning

    uncapped = uncapped_dollar_rows()
    if uncapped:
        return [Finding(WARN, "scoped-limits", uncapped_dollars_warning(uncapped),
                        "set the max cost per run (dispatch settings or PI_MAX_COST_USD)")]
    return [Finding(OK, "scoped-limits", "every dollar window has a per-run cap")]


def check_triggers() -> list[Finding]:
    """Forge triggers that can never fire: an earlier one matches the same deliveries first."""
    from apps.receiver.triggers import never_fires_sentence, never_firing, unpriced_models

    found = [Finding(WARN, "triggers", never_fires_sentence(rule, earlier),
                     "give it an earlier position or a different match (Intake › Triggers)")
             for rule, earlier in never_firing()]
    found += [Finding(WARN, "triggers", f"trigger “{rule}”: {sentence}",
                      "pick a priced model, or price it in PI_MODEL_PRICES")
              for rule, sentence in unpriced_models()]
    return found or [Finding(OK, "triggers", "every enabled forge trigger can fire, at a known price")]


def check_image(client) -> list[Finding]:
    from docker.errors import ImageNotFound

    from apps.worker.sandbox import image_contract

    image = settings.PI_JOB_IMAGE
    if client is None:
        return [Finding(FAIL, "job-image", f"{image}: not checked, no Docker engine", "fix the docker check first")]
    try:
        labels = client.images.get(image).labels or {}
    except ImageNotFound:
        return [Finding(FAIL, "job-image", f"{image} is not on this host's engine (it is never pulled)",
                        "build it here with `make image` (or `docker load` it), or set PI_JOB_IMAGE")]
    reason = image_contract.incompatibility(labels)
    if reason:
        return [Finding(FAIL, "job-image", f"{image} is refused: {reason} (labels "
                        f"{image_contract.PROTOCOL_LABEL}={labels.get(image_contract.PROTOCOL_LABEL) or '-'}, "
                        f"{image_contract.PI_VERSION_LABEL}={labels.get(image_contract.PI_VERSION_LABEL) or '-'}; "
                        f"this worker speaks runner protocol {image_contract.RUNNER_PROTOCOL})",
                        "rebuild it with this checkout's `make image`")]
    found = [Finding(OK, "job-image", f"{image}: pi {labels[image_contract.PI_VERSION_LABEL]}, runner protocol "
                     f"{labels[image_contract.PROTOCOL_LABEL]}")]
    built_from = labels.get(image_contract.INPUTS_LABEL)
    if built_from:
        try:
            from devtools import jobimage

            current = jobimage.inputs_hash()
        except Exception:  # an installation without the build tree: nothing to compare with
            current = None
        if current and current != built_from:
            found.append(Finding(WARN, "job-image-inputs", f"{image} was built from other inputs ({built_from}) than "
                                 f"this checkout's image/ ({current})", "make image"))
    return found


def check_provider(redis, live: bool) -> list[Finding]:
    from apps.worker import known_models
    from apps.worker.gates.checks import egress_settings
    from apps.worker.sandbox import providers

    provider = settings.PI_PROVIDER
    problems = [e for e in egress_settings(None) if e.id in ("worker.E005", "worker.E006", "worker.E007")]
    if problems:
        return [Finding(FAIL, "provider", problem.msg, problem.hint or "see the README, PI_PROVIDER")
                for problem in problems]
    upstream = providers.upstream(provider)
    variable = providers.key_variable(provider)
    if upstream is None:
        return [Finding(FAIL, "provider", f"{provider}: the gateway cannot serve it (no endpoint it can meter)",
                        "set PI_PROVIDER_BASE_URL and PI_PROVIDER_API, or choose a built-in provider")]
    credential = providers.credential(provider)
    if credential is None:
        return [Finding(FAIL, "provider", f"{provider} at {upstream.host_port}: "
                        f"{secret_state(variable or 'its key variable', '')}; jobs are refused provider-unconfigured",
                        f"set {variable} in the worker's environment" if variable
                        else f"set PI_PROVIDER_KEY_VARS={provider}:<VARIABLE> and that variable")]
    found = [Finding(OK, "provider", f"{provider} ({upstream.api}) at {upstream.host_port}: "
                     f"{secret_state(credential[0], credential[1])}, kept out of the container"
                     + ("" if live else "; --live makes one cheap call"))]
    unpriced = known_models.deployment_warning()
    if unpriced:
        found.append(Finding(WARN, "model-price", unpriced, "price it in PI_MODEL_PRICES, or set PI_MODEL to a model "
                             "pi prices"))
    if live:
        found.append(_provider_call(redis, upstream, credential[1]))
    return found


def _cheapest_model(provider: str) -> str:
    from apps.worker.sandbox import providers

    prices = (providers.builtin_providers().get(provider) or {}).get("prices") or {}
    if not prices:
        return ""
    return min(prices, key=lambda name: (prices[name].get("input", 0) + prices[name].get("output", 0), name))


def _provider_request(upstream, model: str) -> tuple[str, dict, dict]:
    """The smallest request of the provider's API: one word in, one token out."""
    prompt = "Say ok."
    if upstream.api == "anthropic-messages":
        return (f"{upstream.path}/v1/messages", {"anthropic-version": "2023-06-01"},
                {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]})
    if upstream.api == "openai-completions":
        return (f"{upstream.path}/chat/completions", {},
                {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]})
    if upstream.api == "openai-responses":
        return f"{upstream.path}/responses", {}, {"model": model, "input": prompt, "max_output_tokens": 16}
    return (f"{upstream.path}/models/{model}:generateContent", {},
            {"contents": [{"role": "user", "parts": [{"text": prompt}]}], "generationConfig": {"maxOutputTokens": 1}})


def _provider_call(redis, upstream, key: str) -> Finding:
    """One call through a real egress gateway, the way a job's pi makes it (the gateway adds the key)."""
    import http.client

    from apps.worker.sandbox.gateway import EgressGateway, GatewayUnavailable, Limits

    model = settings.PI_MODEL or _cheapest_model(upstream.provider)
    if not model:
        return Finding(WARN, "provider-call", "not tried: no model to ask for", "set PI_MODEL")
    # Its sockets belong to the doctor itself (a job's belong to the job's user).
    gateway = EgressGateway(job_id=f"doctor-{os.getpid()}-{int(time.time())}", upstream=upstream, key=key,
                            allow=frozenset(), limits=Limits(daily_token_cap=settings.PI_DAILY_TOKEN_CAP,
                                                             model=settings.PI_MODEL),
                            redis=redis, owner=(os.geteuid(), os.getegid()), on_stop=lambda reason: None,
                            counts_in_the_day=False)
    path, headers, body = _provider_request(upstream, model)
    try:
        with gateway:
            connection = _UnixHTTPConnection(str(gateway.provider_socket), timeout=60)
            connection.request("POST", path, body=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json", **headers})
            answer = connection.getresponse()
            status, data = answer.status, answer.read(65536)
            connection.close()
            tokens = gateway.report.meter.tokens_total
    except GatewayUnavailable as error:
        return Finding(FAIL, "provider-call", f"the egress gateway could not start ({error})",
                       "check PI_EGRESS_SOCKET_DIR: a folder of this user's own, mode 0700")
    except (OSError, http.client.HTTPException) as error:
        return Finding(FAIL, "provider-call", f"the call through the gateway failed ({type(error).__name__})",
                       "see the worker's egress log lines")
    policy = _policy_message(data)
    asked = f"{model} at {upstream.host_port}"
    if status == 200:
        return Finding(OK, "provider-call", f"{asked} answered through a gateway ({tokens} tokens metered)")
    if policy:
        return Finding(FAIL, "provider-call", f"the gateway refused the call: {policy}",
                       "a day's token cap reached waits for the next UTC day (or raise PI_DAILY_TOKEN_CAP); "
                       "an unreachable provider: check this host's route to it")
    if status in (401, 403):
        return Finding(FAIL, "provider-call", f"{asked}: the provider refused the key (HTTP {status})",
                       "replace the key in the worker's environment (jobs would end provider-auth-refused)")
    if status == 429:
        return Finding(WARN, "provider-call", f"{asked}: rate limited (HTTP 429), the key was accepted",
                       "retry later; jobs back off the same way")
    return Finding(WARN, "provider-call", f"{asked}: HTTP {status} (the key was accepted, the request was not)",
                   "set PI_MODEL to a model this key may use")


def _policy_message(data: bytes) -> str:
    try:
        error = json.loads(data).get("error") or {}
    except (ValueError, AttributeError):
        return ""
    if isinstance(error, dict) and error.get("type") == "pidispatch_policy":
        return str(error.get("message", "")).removeprefix("pidispatch egress gateway: ")
    return ""


class _UnixHTTPConnection:
    """http.client over a unix socket (the gateway's provider socket)."""

    def __new__(cls, path: str, timeout: float):
        import http.client

        class Connection(http.client.HTTPConnection):
            def connect(self):
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(path)

        return Connection("localhost", timeout=timeout)


def check_forges(live: bool) -> list[Finding]:
    from apps.receiver.forge_config import ForgeConfigError, forge_settings
    from apps.worker.forges import github_app_problem

    try:
        config = forge_settings()
    except ForgeConfigError as error:
        return [Finding(FAIL, "forges", str(error), "complete that forge's settings (README, the forge rows), "
                        "or unset its webhook secret to stop serving it: the web server refuses to start")]
    served = config.served()
    if not served:
        return [Finding(WARN, "forges", "no forge configured: only local (dispatch_run) and cron jobs can run",
                        "set GITHUB_WEBHOOK_SECRET (or another forge's webhook settings) and its token")]
    found = []
    for forge in served:
        finding = _forge_settings_finding(forge, github_app_problem())
        found.append(finding)
        if live and finding.status != FAIL:
            found.append(_forge_live(forge))
    return found


def _forge_settings_finding(forge: str, app_problem: str) -> Finding:
    entry = forge_registry.get(forge)
    secret_name, token_name, url_name = entry.secret_setting, entry.token_setting, entry.api_url_setting
    token = str(getattr(settings, token_name, "") or "")
    url = safe_url(str(getattr(settings, url_name, "") or ""))
    described = f"{secret_state(secret_name, getattr(settings, secret_name, ''))}, API {url}"
    check = f"forge-{forge}"
    if forge == "github" and str(settings.GITHUB_APP_ID).strip():
        if app_problem:
            return Finding(FAIL, check, f"GitHub App incomplete: {app_problem}", "complete the GITHUB_APP_* settings, "
                           "or unset GITHUB_APP_ID to use GITHUB_TOKEN")
        key_from = "GITHUB_APP_PRIVATE_KEY_PATH" if settings.GITHUB_APP_PRIVATE_KEY_PATH else "GITHUB_APP_PRIVATE_KEY"
        return Finding(OK, check, f"{described}; App {settings.GITHUB_APP_ID} installation "
                       f"{settings.GITHUB_APP_INSTALLATION_ID} (key from {key_from}): each job's token is scoped "
                       "to its repository, contents, issues and pull requests")
    if not token.strip():
        return Finding(FAIL, check, f"{described}; {secret_state(token_name, '')}: its jobs cannot clone or publish "
                       "(forge-unconfigured)", f"set {token_name}" + (" or a GitHub App" if forge == "github" else ""))
    return Finding(OK, check, f"{described}; {secret_state(token_name, token)} (the job token: "
                   "the worker's only, never the container's)")


def _forge_live(forge: str) -> Finding:
    """Who the configured token is, and what it may do, from the configured API (never a forge of our choosing)."""
    from apps.worker.forges import forge_client
    from apps.worker.forges.base import Unreachable

    check = f"forge-{forge}-live"
    client = forge_client(forge)
    token_name = forge_registry.get(forge).token_setting
    try:
        if forge == "github" and client.app is not None:
            slug = client.app.app_slug()
            return Finding(OK, check, f"the App answers as {slug}[bot]")
        response = client._get(f"{client.base_url}{client.identity_path}")
    except Unreachable as error:
        return Finding(FAIL, check, f"{safe_url(client.base_url)} did not answer ({error.reason})",
                       "check this host's route to the forge, or its API URL setting")
    except Exception as error:  # the App's token exchange and friends
        return Finding(FAIL, check, f"the forge's API failed ({type(error).__name__})",
                       "check the forge's API URL and credentials")
    if response.status in (401, 403):
        return Finding(FAIL, check, f"the forge refused {token_name} (HTTP {response.status})",
                       f"create a new token and set {token_name}")
    if response.status != 200:  # the token was not refused; jobs may well work (a proxy, a stand-in, an old server)
        return Finding(WARN, check, f"the forge answered HTTP {response.status} when asked who the token is",
                       "check the forge's API URL setting")
    data = response.data if isinstance(response.data, dict) else {}
    who = (data.get("login") or data.get("username")
           or (data.get("authenticatedUser") or {}).get("providerDisplayName") or "?")
    if forge == "github":
        scopes = [s.strip() for s in response.headers.get("x-oauth-scopes", "").split(",") if s.strip()]
        if "x-oauth-scopes" not in response.headers:
            return Finding(OK, check, f"token of {who}: fine-grained (no scopes listed); it needs contents, issues "
                           "and pull requests read and write on the repositories it serves")
        if "repo" not in scopes and "public_repo" not in scopes:
            return Finding(FAIL, check, f"token of {who} has scopes {', '.join(scopes) or 'none'}: it cannot push or "
                           "open pull requests", "give the token the `repo` scope")
        broad = [s for s in scopes if s in GITHUB_BROAD_SCOPES or s.startswith("admin:")]
        if broad:
            return Finding(WARN, check, f"token of {who} has scopes {', '.join(scopes)}: broader than a job needs "
                           f"({', '.join(broad)})", "use a token with only `repo` (or a fine-grained token, or "
                           "a GitHub App) so a leaked job token cannot change workflows or settings")
        return Finding(OK, check, f"token of {who}, scopes {', '.join(scopes)}")
    if forge == "gitlab":
        try:
            token_info = client._get(f"{client.base_url}/api/v4/personal_access_tokens/self")
        except Unreachable:
            return Finding(OK, check, f"token of {who} (its scopes could not be read)")
        scopes = (token_info.data or {}).get("scopes") if isinstance(token_info.data, dict) else None
        if isinstance(scopes, list):
            broad = [s for s in scopes if s in GITLAB_BROAD_SCOPES]
            if "api" not in scopes:
                return Finding(FAIL, check, f"token of {who} has scopes {', '.join(scopes)}: jobs need `api`",
                               "create a token with the `api` scope")
            if broad:
                return Finding(WARN, check, f"token of {who} has scopes {', '.join(scopes)}: broader than a job needs",
                               f"drop {', '.join(broad)}")
            return Finding(OK, check, f"token of {who}, scopes {', '.join(scopes)}")
    return Finding(OK, check, f"token of {who} (the API lists no scopes for it)")


def check_egress() -> list[Finding]:
    from django.core.exceptions import ImproperlyConfigured

    from apps.worker.sandbox import prices
    from apps.worker.sandbox.egress_policy import PolicyError, parse_allowlist

    found = []
    try:
        allowed = sorted(f"{host}:{port}" for host, port in parse_allowlist(settings.PI_EGRESS_ALLOW))
        found.append(Finding(OK, "egress-allowlist", f"jobs may also reach {', '.join(allowed)}" if allowed
                             else "none: jobs reach their provider and nothing else"))
    except PolicyError as error:
        found.append(Finding(FAIL, "egress-allowlist", str(error),
                             "fix PI_EGRESS_ALLOW: host:port,... (the worker refuses to start with it)"))
    if settings.PI_MODEL_PRICES:
        try:
            prices.price("-", "-")
            found.append(Finding(OK, "model-prices", f"PI_MODEL_PRICES {settings.PI_MODEL_PRICES} reads"))
        except ImproperlyConfigured as error:
            found.append(Finding(FAIL, "model-prices", str(error), "fix or unset PI_MODEL_PRICES"))
    return found


def _profiles(setting: str, check: str, what: str) -> list[Finding]:
    from django.core.exceptions import ImproperlyConfigured

    from apps.fleet.capabilities import parse_profiles

    try:
        profiles = parse_profiles(getattr(settings, setting), setting)
    except ImproperlyConfigured as error:
        return [Finding(FAIL, check, str(error),
                        f"fix {setting}: name:/absolute/path,... (the worker refuses to start)")]
    if not profiles:
        return [Finding(OK, check, f"none declared ({setting})")]
    found = []
    for name, path in sorted(profiles.items()):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(Finding(OK, check, f"{name}: {path} is executable"))
        else:
            found.append(Finding(FAIL, check, f"{name}: {path} is not an executable file on this host; jobs "
                                 f"naming it {what}",
                                 f"install it at {path} and chmod +x it, or drop it from {setting}"))
    return found


def check_profiles() -> list[Finding]:
    found = _profiles("PI_SECRET_PROFILES", "secret-profiles", "retry and fail (secret-resolver-unreachable)")
    if settings.PI_SECRET_RESOLVE_TIMEOUT_MS < 1:
        found.append(Finding(FAIL, "secret-profiles", "PI_SECRET_RESOLVE_TIMEOUT_MS is below 1",
                             "unset it for the default of 10000"))
    found += _profiles("PI_WAIT_PROFILES", "wait-profiles", "fault until they give up (wait-check faults)")
    for name in ("PI_WAIT_INTERVAL_SECONDS", "PI_WAIT_MAX_CHECKS", "PI_WAIT_MAX_SECONDS", "PI_WAIT_MAX_FAULTS",
                 "PI_WAIT_CHECK_TIMEOUT_SECONDS", "PI_WAIT_CHECK_SLOTS"):
        if getattr(settings, name) < 1:
            found.append(Finding(FAIL, "wait-profiles", f"{name} is {getattr(settings, name)}, below 1",
                                 f"unset {name} for its default"))
    return found


# `manage.py check` findings the checks above already say in their own words.
COVERED_CHECK_IDS = {"pidispatch.E001", "worker.W001", *(f"worker.E00{n}" for n in range(1, 9))}


def check_settings() -> list[Finding]:
    """Everything else `manage.py check` names (a setting out of bounds, ...): the worker refuses to start on
    an error, so it is a FAIL here too."""
    from django.core import checks

    found = []
    for message in checks.run_checks():
        if message.id in COVERED_CHECK_IDS or message.level < checks.WARNING:
            continue
        failed = message.level >= checks.ERROR
        found.append(Finding(FAIL if failed else WARN, "settings", f"{message.id}: {message.msg}",
                             message.hint or "see `python manage.py check`"))
    return found or [Finding(OK, "settings", "`manage.py check` finds nothing else")]


def check_disk() -> list[Finding]:
    root = Path(settings.PI_JOB_ROOT)
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # made on the first job: the filesystem it will be on
    free = shutil.disk_usage(probe).free
    free_mb = free // (1024 * 1024)
    shown = f"{free / 1024 ** 3:.1f} GiB free under {root}"
    if free_mb < settings.PI_DOCTOR_MIN_FREE_MB:
        return [Finding(FAIL, "disk", f"{shown}, below PI_DOCTOR_MIN_FREE_MB ({settings.PI_DOCTOR_MIN_FREE_MB} MB): "
                        "a job's clone would fail disk-full", "free space on that filesystem, or point PI_JOB_ROOT "
                        "at a filesystem of its own")]
    if not os.access(probe, os.W_OK):
        return [Finding(FAIL, "disk", f"{probe} is not writable by this user", f"make {probe} this user's own")]
    if settings.PI_JOB_DISK_MB and free_mb < settings.PI_JOB_DISK_MB:
        return [Finding(WARN, "disk", f"{shown}, less than one job may take (PI_JOB_DISK_MB {settings.PI_JOB_DISK_MB})",
                        "free space, or lower PI_JOB_DISK_MB")]
    return [Finding(OK, "disk", shown)]


def check_workspace_bound() -> list[Finding]:
    """A forge job's workspace: bounded by a volume of its size, or by the watch alone (which a fast write
    outruns between two samples)."""
    from apps.worker.sandbox import workspace_volume

    chosen = workspace_volume.method()
    if chosen.name == "volume":
        return [Finding(OK, "workspace-bound", chosen.why)]
    if not settings.PI_JOB_DISK_MB:
        return [Finding(WARN, "workspace-bound", "no disk bound: PI_JOB_DISK_MB=0", "set PI_JOB_DISK_MB")]
    return [Finding(WARN, "workspace-bound", f"the watch alone bounds a workspace ({chosen.why}): a job can write "
                    f"past PI_JOB_DISK_MB between two samples", "run the worker as root on a host with loop devices "
                    "and e2fsprogs, and PI_JOB_WORKSPACE_VOLUME=auto")]


def check_git() -> list[Finding]:
    """The worker's git runs in repositories the agent wrote: one that fetches lazily could be made to run any
    command (the worker refuses to start on it too)."""
    from apps.worker.sandbox.gitrun import git_problem, git_version

    try:
        version = git_version()
    except OSError as error:
        return [Finding(FAIL, "git", f"git does not run on this host ({type(error).__name__})",
                        "install git 2.39.4 or later (the worker clones and publishes with it)")]
    problem = git_problem(version)
    if problem:
        return [Finding(FAIL, "git", problem[0], f"install {problem[1]}; the worker does not start until then")]
    return [Finding(OK, "git", f"{version.removeprefix('git version ')}, fixed against lazy fetching")]


def rows_of_this_machine(hosts) -> list:
    """This host's registry rows: its name's, and any whose worker processes run on this very machine (a
    worker declared by its queue, `rqworker pi-jobs@hostA`, has a name the doctor's settings do not)."""
    from apps.fleet import registry
    from apps.fleet.hosts import this_host

    machine = registry._machine()

    def here(process) -> bool:
        return process.proc.rpartition("/")[0].rpartition("/")[0] == machine

    return [h for h in hosts if h.name == this_host().name or any(here(p) for p in h.processes)]


def check_workers(redis, hosts) -> list[Finding]:
    from apps.fleet.hosts import this_host

    live = [h for h in rows_of_this_machine(hosts) if h.liveness == "live" and h.processes]
    if not live:
        return [Finding(WARN, "workers", f"no worker process of this host ({this_host().name}) is in the registry",
                        "start one: python manage.py rqworker pi-jobs (jobs wait in the queue until then)")]
    return [Finding(OK, "workers", f"{h.name}: {processes(len(h.processes))} ({', '.join(h.queues)}), {h.busy} busy"
                    + (f", cap {h.concurrency}" if h.concurrency else "")) for h in live]


def check_pauses(redis) -> list[Finding]:
    from apps.fleet import pauses
    from apps.fleet.hosts import this_host
    from apps.fleet.queues import host_queue

    mine = ["pi-jobs"] + ([host_queue(this_host().name)] if this_host().declared else [])
    flags = pauses.read_flags(redis)
    paused = [f"{queue} (by {flags[queue].by})" for queue in mine if queue in flags]
    if paused:
        return [Finding(WARN, "pauses", f"paused: {', '.join(paused)}", "python manage.py fleet resume --all "
                        "(or --queue ...), when it is meant to run again")]
    return [Finding(OK, "pauses", f"{', '.join(mine)} not paused")]


def check_housekeeping(redis) -> list[Finding]:
    """The fleet's daily housekeeping (apps/worker/housekeeping.py): when it last completed, and whether it is
    late. Run records and deliveries pile up, and the cost page's first views slow, while it does not run."""
    from datetime import datetime

    from django.utils import timezone

    from apps.fleet.display import age
    from apps.worker import housekeeping

    todo = ("python manage.py housekeeping (it says what stops it); the workers run it once a UTC day "
            "(PI_HOUSEKEEPING_DAILY): look for housekeeping_failed in their logs")
    last = housekeeping.last_run(redis)
    today = housekeeping.todays(redis) or {}
    failed = (f"; today's run failed ({today.get('error', '?')}) at {today.get('at', '?')}"
              if today.get("state") == "failed" else "")
    try:
        at = datetime.fromisoformat(last["at"]) if last else None
    except (KeyError, TypeError, ValueError):
        at = None
    if at is None:
        return [Finding(WARN, "housekeeping", f"no run on record{failed}", todo)]
    since = timezone.now() - at
    deleted = ", ".join(f"{name} {n}" for name, n in (last.get("deleted") or {}).items() if n) or "nothing to delete"
    found = f"last ran {at:%Y-%m-%d %H:%M} UTC, {age(since.total_seconds())} ago ({last.get('how', '?')}): {deleted}"
    if since > housekeeping.STALE_AFTER:
        return [Finding(WARN, "housekeeping", f"has not run for {since.days} days: {found}{failed}", todo)]
    return [Finding(OK, "housekeeping", found + failed)]


# --- the other hosts, as the registry has them ------------------------------------------------------------

def other_hosts(hosts, now: float) -> list[HostReport]:
    from apps.fleet.hosts import code_version

    mine = {h.name for h in rows_of_this_machine(hosts)}
    reports = []
    for host in hosts:
        if host.name in mine or host.liveness == "gone":
            continue
        age = host.beat_age(now)
        report = HostReport(host.name, False, f"{host.liveness}, as it reported {age:.0f} s ago")
        if host.liveness != "live":
            report.findings.append(Finding(WARN, "registry", f"last beat {age:.0f} s ago: its workers may have died",
                                           f"check the worker processes on {host.name} (the row expires by itself)"))
            reports.append(report)
            continue
        report.findings.append(Finding(OK, "registry", f"{processes(len(host.processes))}, {host.busy} busy"
                                       + (f", cap {host.concurrency}" if host.concurrency else "")
                                       + (f", capabilities {', '.join(host.capabilities)}"
                                          if host.capabilities else "")))
        if host.version != code_version():
            report.findings.append(Finding(WARN, "version", f"runs pidispatch {host.version or '?'}, this host "
                                           f"{code_version()}", "upgrade the fleet's hosts together"))
        if host.image and host.image != settings.PI_JOB_IMAGE:
            report.findings.append(Finding(WARN, "job-image", f"runs {host.image}, this host {settings.PI_JOB_IMAGE}",
                                           "fine when meant; else set the same PI_JOB_IMAGE on every host"))
        if not host.declared:
            report.findings.append(Finding(WARN, "declared", "no PI_WORKER_NAME: nothing can be routed to it",
                                           f"set PI_WORKER_NAME on {host.name} to route work to it"))
        reports.append(report)
    return reports


# --- all of it ---------------------------------------------------------------------------------------------

def _guarded(check, *args) -> list[Finding]:
    try:
        return check(*args)
    except Exception as error:  # one broken check must not hide the others' answers
        name = check.__name__.removeprefix("check_")
        return [Finding(FAIL, name, f"the check itself failed ({type(error).__name__})", "report this as a bug")]


def diagnose(live: bool = False) -> list[HostReport]:
    from apps.fleet.connection import get_redis
    from apps.fleet.hosts import this_host
    from apps.fleet.registry import RegistryUnreadable, read_hosts

    redis = get_redis()
    identity = this_host()
    here = HostReport(identity.name, True, "this host" + ("" if identity.declared else ", undeclared"))
    here.findings += _guarded(check_database)
    here.findings += _guarded(check_redis, redis)
    redis_ok = all(f.status != FAIL for f in here.findings if f.check == "redis")
    engine_findings, client = check_engine()
    here.findings += engine_findings
    here.findings += _guarded(check_image, client)
    if client is not None:
        here.findings += _guarded(check_host_budget)
    here.findings += _guarded(check_limits)
    here.findings += _guarded(check_triggers)
    here.findings += _guarded(check_provider, redis, live)
    here.findings += _guarded(check_forges, live)
    here.findings += _guarded(check_egress)
    here.findings += _guarded(check_profiles)
    here.findings += _guarded(check_settings)
    here.findings += _guarded(check_disk)
    here.findings += _guarded(check_workspace_bound)
    here.findings += _guarded(check_git)
    reports = [here]
    if redis_ok:
        now = time.time()
        try:
            hosts = read_hosts(redis, now)
        except RegistryUnreadable as error:
            here.findings.append(Finding(WARN, "workers", str(error), "retry; check Redis"))
            return reports
        here.findings += _guarded(check_workers, redis, hosts)
        here.findings += _guarded(check_pauses, redis)
        here.findings += _guarded(check_housekeeping, redis)
        reports += other_hosts(hosts, now)
    return reports


def exit_code(reports: list[HostReport]) -> int:
    """0 when a job could run on this host (warnings allowed), 1 when something stops it."""
    return 1 if reports[0].failed else 0


def as_json(reports: list[HostReport]) -> dict:
    return {"job_could_run": exit_code(reports) == 0, "exit_code": exit_code(reports),
            "hosts": [{"name": r.name, "this_host": r.this_host, "note": r.note,
                       "checks": [asdict(f) for f in r.findings]} for r in reports]}


def as_text(reports: list[HostReport]) -> str:
    lines = []
    width = max((len(f.check) for r in reports for f in r.findings), default=10)
    for report in reports:
        lines.append(f"== {report.name} ({report.note})")
        for f in report.findings:
            lines.append(f"{f.status:<4}  {f.check:<{width}}  {f.finding}")
            if f.todo and f.status != OK:
                lines.append(f"{'':<4}  {'':<{width}}  -> {f.todo}")
        lines.append("")
    here = reports[0]
    if here.failed:
        lines.append(f"no job can run on this host: {len(here.failed)} FAIL ("
                     f"{', '.join(dict.fromkeys(f.check for f in here.failed))}); do what their -> lines say")
    else:
        lines.append("a job can run on this host" + (f" ({len(here.warned)} warnings)" if here.warned else ""))
    return "\n".join(lines)
