"""pidispatch settings: everything comes from the environment (DESIGN section 9).

Precedence for the knobs the worker reads: job > DB settings row > environment > the defaults here.
An optional `.env` beside manage.py is read first; real environment variables win over it.
"""

import os
import re
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from apps.fleet.connection import rq_queue_config, sentinel_addresses
from apps.fleet.queues import QueueConfigMap
from pidispatch_site import dev_env
from pidispatch_site.private_files import persistent_secret_key, private_folder
from pidispatch_site.sqlite_file import prepare_database_file

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# Folder runs' and skills folders' roots come from the real environment only, never `.env` or var/dev.env (read
# below): a folder run may rewrite any file under its folder, a skills folder is copied into jobs
# (apps/worker/sandbox/folder_roots.py).
_ROOTS_FROM_ENVIRONMENT = {name: os.environ.get(name) for name in ("PI_LOCAL_ROOTS", "PI_SKILLS_ROOTS")}
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

VAR_DIR = Path(env("PI_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()
private_folder(VAR_DIR)  # the key, the database, job folders, Redis's and Docker's data: this user's only
# Beside `make run`: its demo secrets and, while it runs, the services it started (its private Redis listens on
# a port it picked), so `manage.py fleet status` in a second shell finds them. The environment and `.env` win.
# The tests' stack never reads it: their services and config are their own.
if not env.bool("PIDISPATCH_TEST_STACK", default=False):
    dev_env.apply(VAR_DIR / "dev.env")
for _name, _value in _ROOTS_FROM_ENVIRONMENT.items():
    if _value is None:
        os.environ.pop(_name, None)  # what a file put there: not for this process, nor the ones it starts


def _roots(name: str) -> tuple[str, ...]:
    return tuple(root.strip() for root in (_ROOTS_FROM_ENVIRONMENT[name] or "").split(",") if root.strip())

SECRET_KEY = env("DJANGO_SECRET_KEY", default=None) or persistent_secret_key(VAR_DIR / "secret_key")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# Served behind a proxy that terminates TLS: cookies travel over HTTPS only, browsers are told to use nothing
# else (HSTS), and the proxy's X-Forwarded-Proto says a request came over HTTPS. The proxy must set that
# header itself and drop one a client sent, or a plain-HTTP client could claim HTTPS.
if env.bool("DJANGO_SECURE", default=False):
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=365 * 24 * 3600)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# The public edge serves only /hooks/ and /healthz; the admin and API run on a private instance.
PI_PUBLIC_EDGE = env.bool("PI_PUBLIC_EDGE", default=False)
# /metrics (private instance only): when set, a scrape must send `Authorization: Bearer <token>`.
PI_METRICS_TOKEN = env("PI_METRICS_TOKEN", default="")

INSTALLED_APPS = [
    "pidispatch_site.admin_site.PidispatchAdminConfig",  # django.contrib.admin with our site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_rq",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # the API docs page's assets, served from here (no CDN)
    "apps.fleet",
    "apps.worker",
    "apps.receiver",
    "apps.access",
    "apps.insight",  # the cost page and /metrics: read-only views over the run history and Redis
    "apps.notifications",  # outbound notifications: endpoints, deliveries and their attempts
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "pidispatch_site.urls"
WSGI_APPLICATION = "pidispatch_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'pidispatch.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the workers write concurrently: WAL plus immediate transactions turn
    # "database is locked" into a short wait.
    # FULL (SQLite's default) makes every commit survive a power cut. A queued delivery's two inbox writes do
    # not wait for it, since Redis holds its job on disk (pidispatch_site/rowwrites.py; docs/architecture.md
    # says why that is safe). NORMAL keeps commits through any crash of ours and drops the fsync per commit.
    SQLITE_SYNCHRONOUS = env.str("SQLITE_SYNCHRONOUS", default="FULL").upper()
    if SQLITE_SYNCHRONOUS not in ("FULL", "NORMAL"):
        raise ImproperlyConfigured(f"SQLITE_SYNCHRONOUS must be FULL or NORMAL, not {SQLITE_SYNCHRONOUS!r}.")
    SQLITE_LOCK_TIMEOUT = 20  # seconds a write waits for another's
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "timeout": SQLITE_LOCK_TIMEOUT, "transaction_mode": "IMMEDIATE",
        "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={SQLITE_SYNCHRONOUS};",
    })
    # One connection per process, not one per request: opening SQLite and setting its journal mode cost
    # more than a delivery's two writes.
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-pidispatch.sqlite3")}
    # 0600 and in WAL mode before the first connection. A missing folder is left to SQLite's error.
    _database_file = str(DATABASES["default"]["NAME"])
    if _database_file != ":memory:" and not _database_file.startswith("file:") and Path(_database_file).parent.is_dir():
        prepare_database_file(Path(_database_file), SQLITE_LOCK_TIMEOUT)
else:
    # Keep server connections between requests (a webhook burst would otherwise open one per delivery).
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
FORMAT_MODULE_PATH = ["pidispatch_site.formats"]  # seconds and the zone in every admin time
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]  # the site-wide admin look (static/pidispatch/); apps keep their own
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve admin assets straight from the apps when collectstatic has not run (tests, first start).
WHITENOISE_USE_FINDERS = True

# --- Redis and RQ ---------------------------------------------------------------------------------

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
# Behind Redis Sentinel: the primary the sentinels name for REDIS_SENTINEL_MASTER, REDIS_URL's database and
# password applied to it (apps/fleet/connection.py). Unset: the one Redis at REDIS_URL.
try:
    REDIS_SENTINELS = sentinel_addresses(env("REDIS_SENTINELS", default=""))
except ValueError as error:
    raise ImproperlyConfigured(str(error)) from None
REDIS_SENTINEL_MASTER = env("REDIS_SENTINEL_MASTER", default="")
REDIS_SENTINEL_PASSWORD = env("REDIS_SENTINEL_PASSWORD", default="")
if REDIS_SENTINELS and not REDIS_SENTINEL_MASTER:
    raise ImproperlyConfigured("REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER is not: set it to the name the "
                               "sentinels monitor (`sentinel monitor <name> ...` in their configuration).")
# How long a command or a webhook that meets no primary (a failover under way) waits for the new one.
PI_REDIS_FAILOVER_WAIT_SECONDS = env.float("PI_REDIS_FAILOVER_WAIT_SECONDS", default=30)
# The enqueue behind a webhook's 2xx waits until this many replicas hold it (Redis WAIT), for up to
# PI_REDIS_REPLICA_WAIT_MS; replication is asynchronous, and a failover loses what no replica had.
PI_REDIS_MIN_REPLICAS = env.int("PI_REDIS_MIN_REPLICAS", default=0)
PI_REDIS_REPLICA_WAIT_MS = env.int("PI_REDIS_REPLICA_WAIT_MS", default=1000)

# `pi-jobs` plus every valid `pi-jobs@<host>` resolve to one connection, so
# `manage.py rqworker pi-jobs pi-jobs@anyhost` works without a per-host settings edit.
RQ_QUEUES = QueueConfigMap(rq_queue_config(REDIS_URL, REDIS_SENTINELS, REDIS_SENTINEL_MASTER,
                                           REDIS_SENTINEL_PASSWORD, PI_REDIS_FAILOVER_WAIT_SECONDS))
# Enqueue at once (not on commit): the intake must know whether the job exists before it answers.
RQ = {"WORKER_CLASS": "apps.worker.process.rqworker.DispatchWorker", "COMMIT_MODE": "auto"}
RQ_SHOW_ADMIN_LINK = False

# --- Workers and jobs -------------------------------------------------------------------------------

PI_WORKER_NAME = env("PI_WORKER_NAME", default="")
PI_JOB_IMAGE = env("PI_JOB_IMAGE", default="pi-job:latest")
PI_JOB_ROOT = Path(env("PI_JOB_ROOT", default=str(VAR_DIR / "jobs"))).resolve()
# The folders local jobs may run in (comma-separated absolute paths), never the deployment's own files; none
# declared: this host runs no folder. From the real environment only (read above), never `.env` or a file.
PI_LOCAL_ROOTS = _roots("PI_LOCAL_ROOTS")
# Keep each job's /job and /workspace folders after the run (debugging and tests); off in production.
PI_KEEP_JOB_DIRS = env.bool("PI_KEEP_JOB_DIRS", default=False)
# The sandbox (`manage.py sandbox <job id>`, apps/worker/sandbox/sandboxes.py): a finished run's folder is kept this
# many hours on the host that ran it (0: off); `--pin` keeps it PI_SANDBOX_PIN_DAYS longer; the shell logs out
# after PI_SANDBOX_IDLE_MINUTES without input.
PI_SANDBOX_RETENTION_HOURS = env.int("PI_SANDBOX_RETENTION_HOURS", default=24)
PI_SANDBOX_PIN_DAYS = env.int("PI_SANDBOX_PIN_DAYS", default=7)
PI_SANDBOX_IDLE_MINUTES = env.int("PI_SANDBOX_IDLE_MINUTES", default=30)
PI_JOB_MEMORY = env("PI_JOB_MEMORY", default="4g")
PI_JOB_CPUS = env.float("PI_JOB_CPUS", default=2.0)
# What this host's jobs may use together (apps/worker/gates/host_budget.py): `auto` (what the engine reports less the
# reserve), an amount (`24g`, `6`), or `off`. Below one default job the worker refuses to start.
PI_HOST_MEMORY_BUDGET = env("PI_HOST_MEMORY_BUDGET", default="auto")
PI_HOST_CPU_BUDGET = env("PI_HOST_CPU_BUDGET", default="auto")
# What `auto` leaves to the host itself: `auto` is a tenth of its memory (1g to 4g) and one CPU from four CPUs on.
PI_HOST_RESERVE_MEMORY = env("PI_HOST_RESERVE_MEMORY", default="auto")
PI_HOST_RESERVE_CPUS = env("PI_HOST_RESERVE_CPUS", default="auto")
# How soon a job that did not fit the host budget looks again; how far apart two registry reads must be that
# both find no live host whose budget holds a forge job, before it is refused `job-size-exceeds-fleet`.
PI_HOST_BUDGET_RECHECK_SECONDS = env.int("PI_HOST_BUDGET_RECHECK_SECONDS", default=9)
PI_FLEET_FIT_CONFIRM_SECONDS = env.int("PI_FLEET_FIT_CONFIRM_SECONDS", default=30)
# The most containers one host runs at once, below its number of worker processes (unset: one per process);
# the admin's settings row overrides it live (apps/worker/gates/host_slots.py).
PI_CONCURRENCY = env.int("PI_CONCURRENCY", default=0) or None
PI_JOB_PIDS_LIMIT = 512
# The container's root filesystem is read-only; /tmp and the job user's home are tmpfs of at most this many MiB
# each (memory, counted in PI_JOB_MEMORY), so nothing the job writes outside /workspace reaches the host's disk.
PI_JOB_TMP_MB = env.int("PI_JOB_TMP_MB", default=512)
PI_JOB_HOME_MB = env.int("PI_JOB_HOME_MB", default=256)
# The uid:gid a job runs as when the worker itself runs as root (never root inside the container).
PI_JOB_USER = env("PI_JOB_USER", default="1000:1000")
PI_JOB_TIMEOUT_SECONDS = env.int("PI_JOB_TIMEOUT_SECONDS", default=30 * 60)
# The most a job's workspace may take on disk (its files' apparent sizes; a local job's: what it adds), measured
# every poll while the job runs and once more when it ends (apps/worker/sandbox/disk.py); 0 turns it off.
PI_JOB_DISK_MB = env.int("PI_JOB_DISK_MB", default=10 * 1024)
# The most files (and folders and links) it may hold, counted the same way; 0 turns it off.
PI_JOB_MAX_FILES = env.int("PI_JOB_MAX_FILES", default=100_000)
PI_JOB_DISK_POLL_SECONDS = env.float("PI_JOB_DISK_POLL_SECONDS", default=5)
# `manage.py doctor` FAILs this host below this much free space under PI_JOB_ROOT (a clone would fail disk-full).
PI_DOCTOR_MIN_FREE_MB = env.int("PI_DOCTOR_MIN_FREE_MB", default=1024)
PI_MAX_TURNS = env.int("PI_MAX_TURNS", default=30)
PI_MAX_TOKENS = env.int("PI_MAX_TOKENS", default=0) or None
PI_PROVIDER = env("PI_PROVIDER", default="anthropic")
PI_MODEL = env("PI_MODEL", default="")
# The models a job's agent may call (provider/model,... at most 16; a trigger's run.models replaces it): the
# gateway refuses any other (apps/worker/allowed_models.py). Empty: any model of the job's provider.
PI_ALLOWED_MODELS = env("PI_ALLOWED_MODELS", default="")
# Extra `provider:ENV_VAR` pairs for providers the built-in table does not know.
PI_PROVIDER_KEY_VARS = env("PI_PROVIDER_KEY_VARS", default="")
# The egress gateway (apps/worker/sandbox/): the PI_PROVIDER's upstream when it is not pi's built-in endpoint
# (a company proxy, or any OpenAI-compatible server) and that endpoint's API kind for a custom provider.
PI_PROVIDER_BASE_URL = env("PI_PROVIDER_BASE_URL", default="")
PI_PROVIDER_API = env("PI_PROVIDER_API", default="")
# How long a provider may go silent mid-answer before the call counts as failed.
PI_PROVIDER_READ_TIMEOUT_SECONDS = env.int("PI_PROVIDER_READ_TIMEOUT_SECONDS", default=300)
# A job's provider calls at once (more wait for a place), and the largest request body the gateway reads.
PI_GATEWAY_CALLS_IN_FLIGHT = env.int("PI_GATEWAY_CALLS_IN_FLIGHT", default=4)
PI_GATEWAY_MAX_REQUEST_MB = env.int("PI_GATEWAY_MAX_REQUEST_MB", default=8)
# host:port pairs a job may open tunnels to besides its provider (none by default).
PI_EGRESS_ALLOW = env("PI_EGRESS_ALLOW", default="")
# Where each job's gateway sockets live on the host (short: unix socket paths are limited to 108 bytes).
PI_EGRESS_SOCKET_DIR = env("PI_EGRESS_SOCKET_DIR", default="")
# The operator's dollar prices per model (JSON), over pi's list prices.
PI_MODEL_PRICES = env("PI_MODEL_PRICES", default="")
# A trigger or a manual run may name a model neither price list knows (apps/worker/known_models.py): off, it is
# refused at save; on, accepted with a warning, its runs' cost unknown.
PI_ALLOW_UNKNOWN_MODELS = env.bool("PI_ALLOW_UNKNOWN_MODELS", default=False)

# The operator's pi overlay on each worker host (skills, persona, extensions, staged packages; `manage.py import_pi`
# fills it), mounted read-only at /opt/pi-global in every job; extensions in it load unless switched off.
PI_GLOBAL_PI_DIR = env("PI_GLOBAL_PI_DIR", default="")
PI_GLOBAL_ALLOW_EXTENSIONS = env.bool("PI_GLOBAL_ALLOW_EXTENSIONS", default=True)
# The folders a trigger's skills folder (run.skillsDir) may be in (comma-separated absolute paths), never the
# deployment's own files; none declared: no skills folder is copied into a job. From the real environment only.
PI_SKILLS_ROOTS = _roots("PI_SKILLS_ROOTS")
# The venues this host runs jobs on (apps/worker/sandbox/venues.py); a trigger's run.backend picks among them.
PI_BACKENDS = tuple(name.strip() for name in env("PI_BACKENDS", default="local").split(",") if name.strip())
if not PI_BACKENDS or any(not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name) for name in PI_BACKENDS):
    raise ImproperlyConfigured("PI_BACKENDS must be a comma list of venue names, e.g. `local` or `local,podman`.")

# Publishing a completed forge run (apps/worker/forges/publishing/): the worker pushes and opens the pull request.
PI_PR_DRAFT = env.bool("PI_PR_DRAFT", default=True)
# Where a forge job's branch is pushed when its trigger says nothing (run.publishTo): `fork`, the deployment's own
# fork, whose pull request the origin's CI treats as an outside contribution; `origin`, a branch of the repository,
# where its CI runs the agent's code with the repository's secrets.
PI_PUBLISH_TO = env("PI_PUBLISH_TO", default="fork")
if PI_PUBLISH_TO not in ("fork", "origin"):
    raise ImproperlyConfigured(f"PI_PUBLISH_TO must be fork or origin, not {PI_PUBLISH_TO!r}.")
PI_PUBLIC_URL = env("PI_PUBLIC_URL", default="")  # this deployment's admin, linked from what it publishes
PI_GIT_AUTHOR_NAME = env("PI_GIT_AUTHOR_NAME", default="pidispatch")
PI_GIT_AUTHOR_EMAIL = env("PI_GIT_AUTHOR_EMAIL", default="pidispatch@users.noreply.localhost")
PI_MAX_CHANGED_FILES = env.int("PI_MAX_CHANGED_FILES", default=300)
PI_MAX_PUSH_BYTES = env.int("PI_MAX_PUSH_BYTES", default=50 * 1024 * 1024)
# What reading the agent's git history may cost (apps/worker/forges/publishing/measure.py): its commits, the time
# of the whole reading, and each git process's heap (0: no bound). Past one, the work is refused work-too-large.
# A forge job's workspace as an ext4 volume of PI_JOB_DISK_MB (apps/worker/sandbox/workspace_volume.py): auto where
# the host can make one, off for the watch alone.
PI_JOB_WORKSPACE_VOLUME = env("PI_JOB_WORKSPACE_VOLUME", default="auto")
PI_PUBLISH_MAX_COMMITS = env.int("PI_PUBLISH_MAX_COMMITS", default=100)
PI_PUBLISH_TIMEOUT_SECONDS = env.int("PI_PUBLISH_TIMEOUT_SECONDS", default=120)
PI_PUBLISH_GIT_MEMORY_MB = env.int("PI_PUBLISH_GIT_MEMORY_MB", default=1024)
PI_KEEP_WORK_HOURS = env.int("PI_KEEP_WORK_HOURS", default=24)
PI_PUBLISH_ATTEMPTS = env.int("PI_PUBLISH_ATTEMPTS", default=6)
PI_PUBLISH_RETRY_SECONDS = env.float("PI_PUBLISH_RETRY_SECONDS", default=5.0)
# Spend caps (job counts per UTC day / Monday week / month; 0 or unset = no cap).
PI_DAILY_CAP = env.int("PI_DAILY_CAP", default=25) or None
PI_WEEKLY_CAP = env.int("PI_WEEKLY_CAP", default=0) or None
PI_MONTHLY_CAP = env.int("PI_MONTHLY_CAP", default=0) or None
PI_SOFT_HOLD_PCT = env.int("PI_SOFT_HOLD_PCT", default=0) or None
PI_DAILY_TOKEN_CAP = env.int("PI_DAILY_TOKEN_CAP", default=0) or None
# Dollar caps, as dollar strings (apps/worker/gates/money.py parses them; `manage.py check` and every process's start
# refuse a bad one): per job, and per UTC day / Monday week / month, reserved before the container.
PI_MAX_COST_USD = env("PI_MAX_COST_USD", default="")
PI_DAILY_COST_USD = env("PI_DAILY_COST_USD", default="")
PI_WEEKLY_COST_USD = env("PI_WEEKLY_COST_USD", default="")
PI_MONTHLY_COST_USD = env("PI_MONTHLY_COST_USD", default="")
# Run logs (apps/worker/run_logs.py): off by default, since they hold issue text and the agent's output.
PI_CAPTURE_JOB_LOGS = env.bool("PI_CAPTURE_JOB_LOGS", default=False)
PI_JOB_LOG_MAX_BYTES = env.int("PI_JOB_LOG_MAX_BYTES", default=1024 * 1024)
PI_JOB_LOG_RETENTION_DAYS = env.int("PI_JOB_LOG_RETENTION_DAYS", default=14)
# The diff a run page shows (apps/worker/forges/publishing/changes.py), kept as long as run logs.
PI_RUN_DIFF_MAX_BYTES = env.int("PI_RUN_DIFF_MAX_BYTES", default=256 * 1024)
# Housekeeping (apps/worker/housekeeping.py): run records and settled deliveries are kept this many days, and the
# workers run `manage.py housekeeping` once a UTC day across the fleet unless PI_HOUSEKEEPING_DAILY is false.
PI_RUN_RETENTION_DAYS = env.int("PI_RUN_RETENTION_DAYS", default=365)
PI_DELIVERY_RETENTION_DAYS = env.int("PI_DELIVERY_RETENTION_DAYS", default=30)
PI_HOUSEKEEPING_DAILY = env.bool("PI_HOUSEKEEPING_DAILY", default=True)
# Agent sessions (apps/worker/sessions/): a `run.resume` trigger's transcript per target, in the database.
PI_SESSION_MAX_BYTES = env.int("PI_SESSION_MAX_BYTES", default=8 * 1024 * 1024)
PI_SESSION_TTL_DAYS = env.int("PI_SESSION_TTL_DAYS", default=14)
# Host-local capabilities, `name:/abs/path,...`; only the names leave the host.
PI_WAIT_PROFILES = env("PI_WAIT_PROFILES", default="")
PI_SECRET_PROFILES = env("PI_SECRET_PROFILES", default="")
# Wait-for checks: cadence (backing off to 15 minutes), bounds, and the check timeout.
PI_WAIT_INTERVAL_SECONDS = env.int("PI_WAIT_INTERVAL_SECONDS", default=60)
PI_WAIT_MAX_CHECKS = env.int("PI_WAIT_MAX_CHECKS", default=96)
PI_WAIT_MAX_SECONDS = env.int("PI_WAIT_MAX_SECONDS", default=24 * 3600)
PI_WAIT_MAX_FAULTS = env.int("PI_WAIT_MAX_FAULTS", default=5)
PI_WAIT_CHECK_TIMEOUT_SECONDS = env.int("PI_WAIT_CHECK_TIMEOUT_SECONDS", default=10)
PI_WAIT_AFTER_MAX_DAYS = 30
# Wait checks at once per host and, for a declared host, fleet-wide (apps/worker/gates/wait_slots.py); a job denied
# one looks again after at least PI_WAIT_THROTTLE_SECONDS.
PI_WAIT_CHECK_SLOTS = env.int("PI_WAIT_CHECK_SLOTS", default=1)
PI_WAIT_THROTTLE_SECONDS = env.float("PI_WAIT_THROTTLE_SECONDS", default=11)
# How long one secret resolver call (one `run.secrets` reference) may take before it counts as unreachable.
PI_SECRET_RESOLVE_TIMEOUT_MS = env.int("PI_SECRET_RESOLVE_TIMEOUT_MS", default=10000)
# Chaining (apps/worker/chaining/): follow-up jobs a completed run asks for in /outbox, at most this many per job,
# and at most this many links below the job that started the chain (0: chaining off, no /outbox).
PI_CHAIN_MAX_PER_JOB = env.int("PI_CHAIN_MAX_PER_JOB", default=2)
PI_CHAIN_DEPTH_MAX = env.int("PI_CHAIN_DEPTH_MAX", default=1)
# The failure hook (apps/worker/failure_hook.py): an absolute executable run on the worker host once per job that
# failed for good or was stopped after it spent, and how long it may take.
PI_ON_FAILURE = env("PI_ON_FAILURE", default="")
PI_ON_FAILURE_TIMEOUT_MS = env.int("PI_ON_FAILURE_TIMEOUT_MS", default=10000)
# Outbound notifications (apps/notifications/): delivered by `manage.py notify_worker` from the pi-notify queue, each
# tried this many times in all, backing off from PI_NOTIFY_RETRY_SECONDS (doubling), each try bounded in time.
PI_NOTIFY_ATTEMPTS = env.int("PI_NOTIFY_ATTEMPTS", default=5)
PI_NOTIFY_RETRY_SECONDS = env.int("PI_NOTIFY_RETRY_SECONDS", default=30)
PI_NOTIFY_TIMEOUT_SECONDS = env.float("PI_NOTIFY_TIMEOUT_SECONDS", default=10)
# Internal hosts a notification endpoint may reach (names as URLs spell them, addresses, networks): by default
# none, so no endpoint reaches loopback, a private network or a cloud's metadata service.
PI_NOTIFY_INTERNAL_HOSTS = env.list("PI_NOTIFY_INTERNAL_HOSTS", default=[])
# How long a job that found its scope's slots (or its folder) busy waits before it looks again.
PI_SCOPE_BUSY_RECHECK_SECONDS = env.int("PI_SCOPE_BUSY_RECHECK_SECONDS", default=5)
# How soon a job deferred because the database did not answer before any spend is tried again.
PI_DATABASE_RECHECK_SECONDS = env.int("PI_DATABASE_RECHECK_SECONDS", default=10)
# The time zone cron patterns are read in.
PI_CRON_TZ = env("PI_CRON_TZ", default="UTC")
PI_RETRY_ATTEMPTS = 2
PI_RETRY_BACKOFF_SECONDS = env.int("PI_RETRY_BACKOFF_SECONDS", default=60)
# How long a worker running a job rides out a Redis outage before it gives the job up
# (apps/worker/process/redis_outage.py).
PI_REDIS_OUTAGE_SECONDS = env.int("PI_REDIS_OUTAGE_SECONDS", default=60)
# How many times one job runs again, as a new attempt, after the worker running it died (0: never); the
# settings row overrides it live (apps/worker/process/worker_lost.py).
PI_LOST_RETRIES = env.int("PI_LOST_RETRIES", default=1)
# How long RQ keeps a finished job (its payload holds issue text). The DB holds history and the
# delivery inbox holds the long-term dedup; RQ's copy only has to outlive racing duplicates.
PI_FINISHED_JOB_TTL_SECONDS = env.int("PI_FINISHED_JOB_TTL_SECONDS", default=600)
PI_FAILED_JOB_TTL_SECONDS = env.int("PI_FAILED_JOB_TTL_SECONDS", default=7 * 24 * 3600)

# --- Fleet -------------------------------------------------------------------------------------------

# Host registry: each worker process beats every PI_FLEET_BEAT_SECONDS; a row expires after
# PI_FLEET_ROW_TTL_SECONDS; a host is live (routable) while its beat is at most PI_FLEET_LIVE_SECONDS old.
PI_FLEET_BEAT_SECONDS = env.float("PI_FLEET_BEAT_SECONDS", default=15)
PI_FLEET_ROW_TTL_SECONDS = env.int("PI_FLEET_ROW_TTL_SECONDS", default=90)
PI_FLEET_LIVE_SECONDS = env.float("PI_FLEET_LIVE_SECONDS", default=45)
# Routing reads the registry at most this often per process.
PI_FLEET_ROUTE_CACHE_SECONDS = env.float("PI_FLEET_ROUTE_CACHE_SECONDS", default=5)
# Cancel of a running job: how long to wait for its worker to acknowledge, and how long a request lasts.
PI_FLEET_CANCEL_ACK_SECONDS = env.float("PI_FLEET_CANCEL_ACK_SECONDS", default=10)
PI_FLEET_CANCEL_TTL_SECONDS = env.int("PI_FLEET_CANCEL_TTL_SECONDS", default=7 * 24 * 3600)
# The admin fleet panel refreshes itself this often.
PI_FLEET_PANEL_REFRESH_SECONDS = env.int("PI_FLEET_PANEL_REFRESH_SECONDS", default=3)

# --- Receiver ----------------------------------------------------------------------------------------

PI_WEBHOOK_MAX_BYTES = env.int("PI_WEBHOOK_MAX_BYTES", default=2 * 1024 * 1024)
# A forge is served once its webhook secret (or mode, or self id) is set; then its block must be complete.
GITHUB_WEBHOOK_SECRET = env("GITHUB_WEBHOOK_SECRET", default="")
GITHUB_SELF_ID = env("GITHUB_SELF_ID", default="")
# A personal access token: closer-permission lookups, GITHUB_SELF_ID when unset, and (without an App) the
# token forge jobs act with. GITLAB_TOKEN, FORGEJO_TOKEN and AZURE_TOKEN likewise are their forge's job token.
GITHUB_TOKEN = env("GITHUB_TOKEN", default="")
GITHUB_API_URL = env("GITHUB_API_URL", default="https://api.github.com")
# Each forge's web pages' root, for every link to an issue or a pull request (apps/forge_registry.py); unset, it is
# derived from the forge's API URL (api.github.com: github.com; Enterprise's https://host/api/v3: https://host).
GITHUB_WEB_URL = env("GITHUB_WEB_URL", default="")
# The GitHub poller (`manage.py poll_github`, apps/receiver/polling/): for a deployment no webhook can reach.
# POLL_REPOS: owner/name, comma-separated (unset: the GitHub App installation's repositories).
POLL_REPOS = env("POLL_REPOS", default="")
POLL_INTERVAL_SECONDS = env.int("POLL_INTERVAL_SECONDS", default=60)
# A GitHub App instead of (or beside) a token: each job gets an installation token scoped to its one
# repository, minted per job and revoked after it. When set, the App is used for every GitHub call.
GITHUB_APP_ID = env("GITHUB_APP_ID", default="")
GITHUB_APP_INSTALLATION_ID = env("GITHUB_APP_INSTALLATION_ID", default="")
GITHUB_APP_PRIVATE_KEY = env("GITHUB_APP_PRIVATE_KEY", default="")  # the PEM itself (`\n` escapes allowed)
GITHUB_APP_PRIVATE_KEY_PATH = env("GITHUB_APP_PRIVATE_KEY_PATH", default="")  # or a file holding it
# Where the deployment's forks are made (run.publishTo: fork): required with an App (installed there, all
# repositories); with a personal access token, unset is the token's own account.
GITHUB_FORK_ORGANIZATION = env("GITHUB_FORK_ORGANIZATION", default="")
GITLAB_WEBHOOK_MODE = env("GITLAB_WEBHOOK_MODE", default="")  # "token" or "signature"
GITLAB_WEBHOOK_SECRET = env("GITLAB_WEBHOOK_SECRET", default="")
GITLAB_TOKEN = env("GITLAB_TOKEN", default="")
GITLAB_URL = env("GITLAB_URL", default="https://gitlab.com")
GITLAB_WEB_URL = env("GITLAB_WEB_URL", default="")
GITLAB_SELF_ID = env("GITLAB_SELF_ID", default="")
FORGEJO_WEBHOOK_SECRET = env("FORGEJO_WEBHOOK_SECRET", default="")
FORGEJO_TOKEN = env("FORGEJO_TOKEN", default="")
FORGEJO_URL = env("FORGEJO_URL", default="")
FORGEJO_WEB_URL = env("FORGEJO_WEB_URL", default="")
FORGEJO_SELF_ID = env("FORGEJO_SELF_ID", default="")
AZURE_WEBHOOK_MODE = env("AZURE_WEBHOOK_MODE", default="")  # "basic" or "header"
AZURE_WEBHOOK_SECRET = env("AZURE_WEBHOOK_SECRET", default="")
AZURE_WEBHOOK_HEADER = env("AZURE_WEBHOOK_HEADER", default="")
AZURE_ORG_URL = env("AZURE_ORG_URL", default="")
AZURE_WEB_URL = env("AZURE_WEB_URL", default="")
AZURE_GRAPH_URL = env("AZURE_GRAPH_URL", default="")  # derived from AZURE_ORG_URL when unset
AZURE_TOKEN = env("AZURE_TOKEN", default="")
AZURE_SELF_ID = env("AZURE_SELF_ID", default="")
AZURE_SELF_EMAIL = env("AZURE_SELF_EMAIL", default="")
AZURE_FORK_PROJECT = env("AZURE_FORK_PROJECT", default="")  # the deployment's project for its forks (publishTo: fork)
# Besides Project Administrators (known by its SID), the project groups whose members may start work, by the
# account name the process template gave them (a localised server's templates name them differently).
AZURE_WRITER_GROUPS = env.list("AZURE_WRITER_GROUPS", default=["Contributors", "Build Administrators"])
# Forge API calls (authority lookups; a job's token, default branch and comments): short, and lookups are
# cached; "could not tell" keeps the delivery, and a worker-side call that gets no answer is retried.
PI_FORGE_API_TIMEOUT_SECONDS = env.float("PI_FORGE_API_TIMEOUT_SECONDS", default=3.0)
# The longest wait a forge's Retry-After (or rate-limit reset) is honoured for: a retried job waits at least that.
PI_FORGE_RETRY_AFTER_MAX_SECONDS = env.int("PI_FORGE_RETRY_AFTER_MAX_SECONDS", default=3600)
PI_AUTHORITY_CACHE_SECONDS = env.int("PI_AUTHORITY_CACHE_SECONDS", default=60)
# A forge job's workspace: the shallow clone of the default branch must finish within this many seconds
# (then the attempt is retried as an infrastructure fault).
PI_CLONE_TIMEOUT_SECONDS = env.int("PI_CLONE_TIMEOUT_SECONDS", default=300)
# A second trigger for the same target and flow inside this window is swallowed (202 duplicate).
PI_DEDUP_WINDOW_SECONDS = env.int("PI_DEDUP_WINDOW_SECONDS", default=600)
# A body that started jobs within this window is a duplicate under any other delivery id (0: off).
PI_REPLAY_WINDOW_SECONDS = env.int("PI_REPLAY_WINDOW_SECONDS", default=7 * 24 * 3600)
# The inbox replayer (`manage.py replay_deliveries --follow`): poll interval and the longest retry backoff.
PI_INBOX_POLL_SECONDS = env.float("PI_INBOX_POLL_SECONDS", default=1.0)
PI_INBOX_MAX_BACKOFF_SECONDS = env.int("PI_INBOX_MAX_BACKOFF_SECONDS", default=600)
# The replayer also reconciles the accepted jobs with Redis (apps/worker/accepted.py): at once with a Redis process
# it has not reconciled with (restarted empty, or from an older copy), and every this many seconds otherwise.
PI_RECONCILE_SECONDS = env.int("PI_RECONCILE_SECONDS", default=60)

# --- Logging: one `event key=value` line per event, ids only (never titles, bodies or logins) ------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "pidispatch": {"handlers": ["console"], "level": env("PI_LOG_LEVEL", default="INFO"), "propagate": False},
        "django": {"handlers": ["console"], "level": "WARNING"},
    },
}


# --- The REST API (/api/v1/, pidispatch_site/api.py) ------------------------------------------------------

PI_API_RATE = env("PI_API_RATE", default="600/min")  # requests per token (or session user)
PI_API_PAGE_SIZE = 50
# The OpenAPI schema and its docs page are for signed-in users and tokens; true serves them to anyone.
PI_API_SCHEMA_PUBLIC = env.bool("PI_API_SCHEMA_PUBLIC", default=False)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.access.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["apps.access.permissions.ScopeAndPermissions"],
    "DEFAULT_THROTTLE_CLASSES": ["apps.access.throttling.TokenRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer",
                                 "rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "pidispatch_site.api_errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "pidispatch API",
    "DESCRIPTION": "Runs, jobs, triggers, deliveries, the fleet and spend: everything an operator does in the admin.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["apps.access.permissions.SchemaReaders"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "pidispatch_site.api_errors.document_errors",
                             "pidispatch_site.api_base.close_brief_components"],
}
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # Shared by every web process: the API's per-token request counts.
    "api": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
            "KEY_PREFIX": "pidispatch:api", "TIMEOUT": 120,
            "OPTIONS": {"pool_class": "apps.fleet.connection.CachePool", "socket_connect_timeout": 1,
                        "socket_timeout": 1}},
}
