"""Every variable pidispatch reads from its environment, with its default and one line on what it does: the source
of contrib/pidispatch.env.example (`python -m devtools.env_example` writes it).

`default` is the value as an environment file would write it, equal to settings.py's default (a test compares the
two); `None` where the default is worked out at start (a path under PI_VAR_DIR, a generated key), and `note` then
says what it is. The README's settings table says more about each; tests/site/test_deploy_settings.py fails when
a variable settings.py reads is missing here, from the README's table or from the example file.

Pure data: nothing here imports Django, so the generator and the tests read it without settings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None
    meaning: str
    note: str = ""  # what the default is, when it is worked out at start


@dataclass(frozen=True)
class Section:
    title: str
    read_by: str
    settings: tuple[Setting, ...]


S = Setting

SECTIONS: tuple[Section, ...] = (
    Section("Files and the database", "every process", (
        S("PI_VAR_DIR", None, "The folder of this host's files: the generated secret key, the SQLite database, job "
          "folders (PI_JOB_ROOT), static files. Made 0700.", note="var/ in the checkout; the systemd units set "
          "/var/lib/pidispatch (their StateDirectory)"),
        S("DATABASE_URL", None, "The database. Several hosts share one PostgreSQL: "
          "postgres://user:password@host:5432/pidispatch.", note="sqlite:///<PI_VAR_DIR>/pidispatch.sqlite3"),
        S("SQLITE_SYNCHRONOUS", "FULL", "SQLite only. FULL: every commit survives a power cut; NORMAL: it survives "
          "any crash of pidispatch but not a power cut."),
        S("DATABASE_CONN_MAX_AGE", "60", "Seconds a process keeps its database connection between requests."),
        S("PI_LOG_LEVEL", "INFO", "The level of pidispatch's own log lines (DEBUG, INFO, WARNING, ERROR)."),
    )),
    Section("Redis", "every process", (
        S("REDIS_URL", "redis://127.0.0.1:6379/0", "The shared queue. Run that Redis with appendonly yes and "
          "appendfsync always: a queued delivery's job is its only copy. Behind Sentinel: its database number and "
          "password apply to the primary the sentinels name (its host and port are not used)."),
        S("REDIS_SENTINELS", "", "host:port,... of the Redis Sentinels (three, on three hosts): every process finds "
          "the primary through them and follows a failover. Empty: the one Redis at REDIS_URL."),
        S("REDIS_SENTINEL_MASTER", "", "The name the sentinels monitor (`sentinel monitor <name> ...`); required "
          "with REDIS_SENTINELS."),
        S("REDIS_SENTINEL_PASSWORD", "", "The sentinels' own password (their requirepass), when they have one."),
        S("PI_REDIS_FAILOVER_WAIT_SECONDS", "30", "Behind Sentinel: how long a command, a webhook or a worker that "
          "meets no primary waits for the new one before it fails as with Redis down."),
        S("PI_REDIS_MIN_REPLICAS", "0", "The enqueue behind a webhook's 2xx (and every other start of a job) waits "
          "until this many replicas hold it (Redis WAIT): a failover then loses none of it. 0: no wait."),
        S("PI_REDIS_REPLICA_WAIT_MS", "1000", "How long that wait may take; past it the job stays queued on the "
          "primary and in the database (the reconciler queues it again if a failover loses it), and a warning "
          "says so."),
        S("PI_FINISHED_JOB_TTL_SECONDS", "600", "How long RQ keeps a finished job (its payload holds issue text; the "
          "database keeps the history)."),
        S("PI_FAILED_JOB_TTL_SECONDS", "604800", "How long RQ keeps a failed job on the failed list (the fleet "
          "panel's retry and discard)."),
    )),
    Section("The web server and the public edge", "gunicorn (pidispatch-web, pidispatch-edge)", (
        S("PI_WEB_BIND", "127.0.0.1:8000", "Where gunicorn listens (contrib/gunicorn.conf.py). The units set it: "
          "the private server 127.0.0.1:8000, the edge 127.0.0.1:8001; change it in web.env or edge.env."),
        S("PI_WEB_WORKERS", "4", "gunicorn's worker processes (contrib/gunicorn.conf.py)."),
        S("PI_PUBLIC_EDGE", "false", "true: serve only /hooks/ and /healthz (pidispatch-edge sets it on its command "
          "line); the admin, API and /metrics run on a private instance."),
        S("DJANGO_SECRET_KEY", None, "Signs sessions and CSRF tokens: the same on every web host.",
          note="generated once into <PI_VAR_DIR>/secret_key (0600)"),
        S("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]", "The host names the web server answers "
          "(comma-separated): add the proxy's public and private names."),
        S("DJANGO_CSRF_TRUSTED_ORIGINS", "", "Origins the admin's forms may be posted from behind a proxy, "
          "e.g. https://pi.example.com."),
        S("DJANGO_SECURE", "false", "true behind a proxy that terminates TLS: cookies over HTTPS only, HSTS, "
          "X-Forwarded-Proto: https trusted (the proxy must set it on every request)."),
        S("DJANGO_HSTS_SECONDS", "31536000", "With DJANGO_SECURE: how long browsers are told to use HTTPS only."),
        S("DJANGO_DEBUG", "false", "Django's debug pages. Never true on a reachable server: an error page shows "
          "settings and request data."),
        S("PI_METRICS_TOKEN", "", "When set, /metrics answers only Authorization: Bearer <token>; unset, only a "
          "direct scrape from this host."),
        S("PI_API_RATE", "600/min", "Requests per API token (or signed-in user), counted in Redis across web "
          "processes; past it 429."),
        S("PI_API_SCHEMA_PUBLIC", "false", "true serves the API's schema and docs page to anyone, not only to "
          "signed-in users and tokens."),
        S("PI_PUBLIC_URL", "", "This deployment's admin, e.g. https://pi.example.com: linked from the pull "
          "requests the workers open."),
    )),
    Section("Webhooks and the inbox", "the web server, the edge and the inbox replayer", (
        S("PI_WEBHOOK_MAX_BYTES", "2097152", "The largest webhook body accepted (413 past it)."),
        S("PI_DEDUP_WINDOW_SECONDS", "600", "A second trigger for the same target and flow within this window "
          "answers 202 duplicate (0: off)."),
        S("PI_REPLAY_WINDOW_SECONDS", "604800", "A body that started jobs within this window is a duplicate under "
          "any other delivery id (0: off)."),
        S("PI_INBOX_POLL_SECONDS", "1", "How often the inbox replayer (replay_deliveries --follow) looks."),
        S("PI_INBOX_MAX_BACKOFF_SECONDS", "600", "The longest retry backoff of a pending delivery."),
        S("PI_RECONCILE_SECONDS", "60", "How often the replayer also looks for accepted jobs Redis no longer "
          "holds and queues them again (at once when Redis restarted empty or from an older copy)."),
        S("PI_FORGE_API_TIMEOUT_SECONDS", "3", "Timeout of forge API calls (lookups, tokens, branches, comments)."),
        S("PI_FORGE_RETRY_AFTER_MAX_SECONDS", "3600", "The longest Retry-After (or rate-limit reset) of a forge that "
          "is honoured; a job retried after a forge's rate limit waits at least the forge's wait, up to this."),
        S("PI_AUTHORITY_CACHE_SECONDS", "60", "How long a determinate write-access lookup is reused."),
    )),
    Section("GitHub", "every process (served once GITHUB_WEBHOOK_SECRET or GITHUB_SELF_ID is set)", (
        S("GITHUB_WEBHOOK_SECRET", "", "Verifies deliveries (X-Hub-Signature-256)."),
        S("GITHUB_SELF_ID", "", "This deployment's own GitHub account id (the bot-loop guard); read from GET /user "
          "with GITHUB_TOKEN when unset."),
        S("GITHUB_TOKEN", "", "The token GitHub jobs act with and write-access lookups use, unless an App is set."),
        S("GITHUB_API_URL", "https://api.github.com", "GitHub's API (GitHub Enterprise: https://host/api/v3)."),
        S("GITHUB_WEB_URL", "", "Where GitHub's pages are, for links to issues and pull requests; unset: from "
          "GITHUB_API_URL (https://github.com, or the Enterprise host)."),
        S("POLL_REPOS", "", "The GitHub poller's repositories (owner/name, comma-separated); unset: the GitHub "
          "App installation's."),
        S("POLL_INTERVAL_SECONDS", "60", "How often the GitHub poller (poll_github) reads each repository (at "
          "least 30)."),
        S("GITHUB_APP_ID", "", "A GitHub App used for every GitHub call instead of the token."),
        S("GITHUB_APP_INSTALLATION_ID", "", "The App's installation."),
        S("GITHUB_APP_PRIVATE_KEY", "", "The App's private key, the PEM itself (\\n escapes allowed)."),
        S("GITHUB_APP_PRIVATE_KEY_PATH", "", "Or a file holding it."),
        S("GITHUB_FORK_ORGANIZATION", "", "The organization the deployment's forks are made in (run.publishTo: "
          "fork). With an App: required, the App installed there on all repositories with Administration and "
          "Contents write; with a token: unset is the token's own account."),
    )),
    Section("GitLab", "every process (served once the mode, secret or self id is set)", (
        S("GITLAB_WEBHOOK_MODE", "", "token (the webhook's secret token) or signature (its whsec_ signing token)."),
        S("GITLAB_WEBHOOK_SECRET", "", "That secret."),
        S("GITLAB_TOKEN", "", "Access-level lookups and the token GitLab jobs act with (scope api)."),
        S("GITLAB_URL", "https://gitlab.com", "The GitLab instance."),
        S("GITLAB_WEB_URL", "", "Where its pages are, for links; unset: GITLAB_URL."),
        S("GITLAB_SELF_ID", "", "This deployment's own GitLab user id; from the API when unset."),
    )),
    Section("Forgejo and Gitea", "every process (served once the secret or self id is set)", (
        S("FORGEJO_WEBHOOK_SECRET", "", "Verifies deliveries."),
        S("FORGEJO_TOKEN", "", "Permission lookups and the token Forgejo jobs act with."),
        S("FORGEJO_URL", "", "The instance, e.g. https://codeberg.org."),
        S("FORGEJO_WEB_URL", "", "Where its pages are, for links; unset: FORGEJO_URL."),
        S("FORGEJO_SELF_ID", "", "This deployment's own user id; from the API when unset."),
    )),
    Section("Azure DevOps", "every process (served once the mode, secret or self id is set)", (
        S("AZURE_WEBHOOK_MODE", "", "basic (the service hook's basic credential) or header (a header's value)."),
        S("AZURE_WEBHOOK_SECRET", "", "That credential or value."),
        S("AZURE_WEBHOOK_HEADER", "", "With header: the header's name."),
        S("AZURE_ORG_URL", "", "The organisation, e.g. https://dev.azure.com/acme."),
        S("AZURE_WEB_URL", "", "Where its pages are, for links; unset: AZURE_ORG_URL."),
        S("AZURE_GRAPH_URL", "", "The Graph API; derived from AZURE_ORG_URL when unset."),
        S("AZURE_TOKEN", "", "The PAT: project-membership lookups (vso.graph) and the token Azure jobs act with."),
        S("AZURE_SELF_ID", "", "This deployment's own identity id."),
        S("AZURE_SELF_EMAIL", "", "Its email."),
        S("AZURE_FORK_PROJECT", "", "The project (name or id) of the organisation where the deployment keeps its "
          "forks, for triggers that publish through a fork (run.publishTo: fork); AZURE_TOKEN may create "
          "repositories there. Unset: Azure DevOps jobs that publish through a fork are refused (fork-unavailable)."),
        S("AZURE_WRITER_GROUPS", "Contributors,Build Administrators", "Project groups besides Project "
          "Administrators whose members may start work, by their account name."),
    )),
    Section("Worker hosts: identity, Docker, the job image", "the workers and the cron producer", (
        S("PI_WORKER_NAME", "", "Declares this host (its queue pi-jobs@<name>); pidispatch-worker@<name> sets it "
          "from its instance, and the cron producer needs it to send a host's cron jobs to that host."),
        S("DOCKER_HOST", "", "The Docker engine (read by the Docker client; unset: the default socket)."),
        S("PI_JOB_IMAGE", "pi-job:latest", "The job image, never pulled: build it on each worker host (make image)."),
        S("PI_JOB_ROOT", None, "Where each job's folder lives: give it a filesystem of its own.",
          note="<PI_VAR_DIR>/jobs"),
        S("PI_LOCAL_ROOTS", "", "Folders under which this host runs local jobs (comma-separated). Read from the "
          "process's environment only, never .env; keep /etc/pidispatch outside every root."),
        S("PI_EGRESS_SOCKET_DIR", "", "Where each job's gateway sockets live. pidispatch-worker@ sets its own runtime "
          "directory; without it: /run/pidispatch-egress as root, else a private folder in /tmp."),
        S("PI_JOB_USER", "1000:1000", "uid:gid forge jobs run as when the worker runs as root (never 0)."),
        S("PI_KEEP_JOB_DIRS", "false", "Keep each job's /job and /workspace folders after the run (debugging); "
          "they hold issue text and the clone, so off in production."),
        S("PI_CONCURRENCY", "0", "The most containers this host runs at once (0: one per worker process); the "
          "admin's settings row overrides it."),
        S("PI_SANDBOX_RETENTION_HOURS", "24", "Hours a finished run's folder stays on its host for `manage.py "
          "sandbox <job id>` (0: off)."),
        S("PI_SANDBOX_PIN_DAYS", "7", "Days `manage.py sandbox --pin <job id>` adds to a kept run folder."),
        S("PI_SANDBOX_IDLE_MINUTES", "30", "A sandbox's shell logs out after this many minutes without input."),
        S("PI_GLOBAL_PI_DIR", "", "The operator's pi overlay on this host (skills, persona, extensions, staged "
          "packages; `manage.py import_pi` fills it), mounted read-only at /opt/pi-global in every job."),
        S("PI_GLOBAL_ALLOW_EXTENSIONS", "true", "Load the overlay's extensions (and its packages' extensions) in "
          "jobs; false: skills, prompts and persona only."),
        S("PI_SKILLS_ROOTS", "", "Folders under which a trigger's skills folder (run.skillsDir) may be "
          "(comma-separated). Read from the process's environment only, never .env."),
        S("PI_BACKENDS", "local", "The venues this host runs jobs on (comma list); a trigger's run.backend picks "
          "among them, others are refused backend-unblessed. podman is known but not run yet (backend-unavailable)."),
    )),
    Section("The job's container", "the workers", (
        S("PI_JOB_MEMORY", "4g", "Memory limit per container."),
        S("PI_JOB_CPUS", "2", "CPU limit per container."),
        S("PI_HOST_MEMORY_BUDGET", "auto", "The memory this host's jobs may use together: auto (what the engine "
          "reports less PI_HOST_RESERVE_MEMORY), an amount (24g) or off. Below one default job the worker refuses "
          "to start."),
        S("PI_HOST_CPU_BUDGET", "auto", "The CPUs this host's jobs may use together: auto (the engine's less "
          "PI_HOST_RESERVE_CPUS), a number or off."),
        S("PI_HOST_RESERVE_MEMORY", "auto", "What auto leaves to the host: auto is a tenth of its memory, 1g to 4g."),
        S("PI_HOST_RESERVE_CPUS", "auto", "What auto leaves to the host: auto is one CPU from four CPUs on, else 0."),
        S("PI_HOST_BUDGET_RECHECK_SECONDS", "9", "How soon a job that did not fit the host budget looks again."),
        S("PI_FLEET_FIT_CONFIRM_SECONDS", "30", "How far apart two registry reads must agree that no live host's "
          "budget holds a forge job before it is refused job-size-exceeds-fleet."),
        S("PI_JOB_TMP_MB", "512", "Size of the container's /tmp (tmpfs, counted in its memory)."),
        S("PI_JOB_HOME_MB", "256", "Size of the job user's home (tmpfs)."),
        S("PI_JOB_TIMEOUT_SECONDS", "1800", "Hard limit per container, then it is stopped (worker-abort). Raise "
          "TimeoutStopSec of pidispatch-worker@ with it."),
        S("PI_JOB_DISK_MB", "10240", "The most a job's workspace may hold, in MiB (0: no limit)."),
        S("PI_JOB_MAX_FILES", "100000", "The most entries it may hold (0: no limit)."),
        S("PI_JOB_DISK_POLL_SECONDS", "5", "How often the workspace is measured while the job runs."),
        S("PI_JOB_WORKSPACE_VOLUME", "auto", "auto: a forge job's workspace is an ext4 volume of PI_JOB_DISK_MB and "
          "PI_JOB_MAX_FILES where the host can make one (a root worker, loop devices, e2fsprogs), so no write gets "
          "past them; doctor warns where it cannot. off: the watch alone."),
        S("PI_DOCTOR_MIN_FREE_MB", "1024", "manage.py doctor fails this host below this much free space under "
          "PI_JOB_ROOT."),
        S("PI_CLONE_TIMEOUT_SECONDS", "300", "A forge job's clone must finish within this (else retried)."),
    )),
    Section("The model and the egress gateway", "the workers", (
        S("PI_PROVIDER", "anthropic", "The provider pi calls, through the job's egress gateway."),
        S("ANTHROPIC_API_KEY", "", "The provider's key (or OPENAI_API_KEY, GEMINI_API_KEY, OPENROUTER_API_KEY, ...: "
          "apps/worker/sandbox/pi_registry.json names each provider's). It stays on the worker."),
        S("PI_PROVIDER_KEY_VARS", "", "provider:VARIABLE,... names the key variable of a provider pi's table does "
          "not know."),
        S("PI_MODEL", "", "The only model the gateway forwards, when set."),
        S("PI_ALLOWED_MODELS", "", "provider/model,... (at most 16, no spaces) the agent may choose among; the gateway "
          "refuses any other. A trigger's run.models replaces it. Empty: any."),
        S("PI_PROVIDER_BASE_URL", "", "Where the provider's calls really go (a company proxy, another endpoint)."),
        S("PI_PROVIDER_API", "", "That endpoint's API kind: openai-completions, openai-responses, anthropic-messages, "
          "google-generative-ai."),
        S("PI_PROVIDER_READ_TIMEOUT_SECONDS", "300", "How long a provider may go silent mid-answer."),
        S("PI_GATEWAY_CALLS_IN_FLIGHT", "4", "A job's provider calls at once."),
        S("PI_GATEWAY_MAX_REQUEST_MB", "8", "The largest request body the gateway reads."),
        S("PI_EGRESS_ALLOW", "", "host:port,... a job may reach besides its provider."),
        S("PI_MODEL_PRICES", "", "A JSON file of dollar prices per million tokens, over pi's list prices."),
        S("PI_ALLOW_UNKNOWN_MODELS", "false", "true: a trigger or a manual run may name a model no price list knows "
          "(a warning; its runs' cost is unknown, and a dollar cap refuses them). false: refused at save."),
    )),
    Section("Budgets and caps", "the workers (the admin's settings row overrides most of them live)", (
        S("PI_MAX_TURNS", "30", "Turns per run."),
        S("PI_MAX_TOKENS", "0", "Tokens per run (0: no limit)."),
        S("PI_DAILY_CAP", "25", "Jobs per UTC day (0: no cap)."),
        S("PI_WEEKLY_CAP", "0", "Jobs per Monday week (0: no cap)."),
        S("PI_MONTHLY_CAP", "0", "Jobs per calendar month (0: no cap)."),
        S("PI_SOFT_HOLD_PCT", "0", "Past this share of a cap the next start waits (0: off)."),
        S("PI_DAILY_TOKEN_CAP", "0", "Tokens per UTC day across all runs (0: no cap)."),
        S("PI_MAX_COST_USD", "", "Dollars one run may spend, e.g. 2.50 (needed by every dollar window)."),
        S("PI_DAILY_COST_USD", "", "Dollars per UTC day across all runs."),
        S("PI_WEEKLY_COST_USD", "", "Dollars per Monday week."),
        S("PI_MONTHLY_COST_USD", "", "Dollars per calendar month."),
    )),
    Section("Publishing", "the workers", (
        S("PI_PR_DRAFT", "true", "Pull/merge requests the worker opens are drafts."),
        S("PI_PUBLISH_TO", "fork", "Where a forge job's branch goes when its trigger's run.publishTo is unset: fork "
          "(the deployment's own fork: its pull request gets no CI secret until a person approves; a forge or "
          "credentials that cannot fork refuse the job fork-unavailable) or origin (a branch of the repository, "
          "where its CI runs the agent's code with the repository's secrets)."),
        S("PI_GIT_AUTHOR_NAME", "pidispatch", "The bot identity every published commit carries."),
        S("PI_GIT_AUTHOR_EMAIL", "pidispatch@users.noreply.localhost", "Its email."),
        S("PI_MAX_CHANGED_FILES", "300", "More changed paths than this is not pushed."),
        S("PI_MAX_PUSH_BYTES", "52428800", "More new content than this is not pushed."),
        S("PI_PUBLISH_MAX_COMMITS", "100", "More agent commits than this are not read (work-too-large)."),
        S("PI_PUBLISH_TIMEOUT_SECONDS", "120", "Reading the agent's work (its commits, its tree) must end within this "
          "(work-too-large)."),
        S("PI_PUBLISH_GIT_MEMORY_MB", "1024", "The heap of each git process that reads the agent's work (0: no "
          "bound)."),
        S("PI_PUBLISH_ATTEMPTS", "6", "Tries of the publish step on a transient forge error."),
        S("PI_PUBLISH_RETRY_SECONDS", "5", "The first backoff between them (doubling)."),
        S("PI_KEEP_WORK_HOURS", "24", "How long work that did not reach the forge is kept for Publish again."),
    )),
    Section("Chaining and the failure hook", "the workers", (
        S("PI_CHAIN_MAX_PER_JOB", "2", "Follow-up jobs one completed run may ask for in /outbox (the rest refused)."),
        S("PI_CHAIN_DEPTH_MAX", "1", "Links a chain may grow below the job that started it (0: chaining off)."),
        S("PI_ON_FAILURE", "", "An absolute executable run once per job that failed for good or stopped after "
          "spending: argv <job id> <outcome> <reason> <host>, a JSON document on stdin."),
        S("PI_ON_FAILURE_TIMEOUT_MS", "10000", "How long the failure hook may run before it is stopped."),
    )),
    Section("Notifications", "manage.py notify_worker (endpoints are set in the admin)", (
        S("PI_NOTIFY_ATTEMPTS", "5", "Tries of one notification delivery in all."),
        S("PI_NOTIFY_RETRY_SECONDS", "30", "The first backoff between them (doubling)."),
        S("PI_NOTIFY_TIMEOUT_SECONDS", "10", "How long one try may take."),
        S("PI_NOTIFY_INTERNAL_HOSTS", "", "Internal hosts an endpoint may reach (host names as URLs spell them, "
          "addresses or networks, comma-separated); unset: none (no loopback, private network or metadata "
          "service)."),
    )),
    Section("Run logs", "the workers", (
        S("PI_CAPTURE_JOB_LOGS", "false", "Keep each run's container output and summary (they hold issue text)."),
        S("PI_JOB_LOG_MAX_BYTES", "1048576", "The most kept per run."),
        S("PI_JOB_LOG_RETENTION_DAYS", "14", "Kept logs older than this are deleted by the workers' sweep."),
        S("PI_RUN_DIFF_MAX_BYTES", "262144", "The most of a run's diff its page keeps (scrubbed; deleted with the "
          "logs)."),
    )),
    Section("Housekeeping", "the workers and manage.py housekeeping", (
        S("PI_RUN_RETENTION_DAYS", "365", "Run records are kept this many whole UTC days (at least 1); housekeeping "
          "deletes older ones, and /metrics goes on counting them."),
        S("PI_DELIVERY_RETENTION_DAYS", "30", "Settled deliveries are kept this many days (at least 7); a pending "
          "one is kept whatever its age."),
        S("PI_HOUSEKEEPING_DAILY", "true", "The workers run housekeeping once a UTC day across the fleet; false: "
          "run `manage.py housekeeping` daily from a scheduler of your own."),
    )),
    Section("Agent sessions (run.resume)", "the workers", (
        S("PI_SESSION_MAX_BYTES", "8388608", "The largest session transcript kept per target (larger: not kept)."),
        S("PI_SESSION_TTL_DAYS", "14", "A kept session not resumed within this many days is not resumed."),
    )),
    Section("Wait-for checks and secret resolvers", "the workers", (
        S("PI_WAIT_PROFILES", "", "name:/abs/path,... check scripts for run.waitFor."),
        S("PI_WAIT_INTERVAL_SECONDS", "60", "How often a held job is checked (backing off to 15 minutes)."),
        S("PI_WAIT_MAX_CHECKS", "96", "The most checks per job."),
        S("PI_WAIT_MAX_SECONDS", "86400", "The longest a job is held."),
        S("PI_WAIT_MAX_FAULTS", "5", "Check faults in a row before the job is refused."),
        S("PI_WAIT_CHECK_TIMEOUT_SECONDS", "10", "How long one check may run."),
        S("PI_WAIT_CHECK_SLOTS", "1", "Wait checks at once on a host (and fleet-wide for a declared host)."),
        S("PI_WAIT_THROTTLE_SECONDS", "11", "How soon a job denied a check slot looks again."),
        S("PI_SECRET_PROFILES", "", "name:/abs/path,... secret resolvers this host offers."),
        S("PI_SECRET_RESOLVE_TIMEOUT_MS", "10000", "How long one resolver call may take."),
    )),
    Section("Retries, deferrals and outages", "the workers", (
        S("PI_RETRY_BACKOFF_SECONDS", "60", "The first retry delay after an infrastructure fault."),
        S("PI_SCOPE_BUSY_RECHECK_SECONDS", "5", "How soon a job that found its scope or host busy looks again."),
        S("PI_DATABASE_RECHECK_SECONDS", "10", "How soon a job deferred because the database did not answer looks "
          "again."),
        S("PI_REDIS_OUTAGE_SECONDS", "60", "How long a worker running a job rides out a Redis outage before it "
          "gives the job up and exits (for systemd to restart it)."),
        S("PI_LOST_RETRIES", "1", "How many times a job runs again after the worker running it died (0: never)."),
    )),
    Section("The fleet", "every process", (
        S("PI_FLEET_BEAT_SECONDS", "15", "Each worker process's registry beat."),
        S("PI_FLEET_ROW_TTL_SECONDS", "90", "A registry row expires after this."),
        S("PI_FLEET_LIVE_SECONDS", "45", "A host is live (routable) while its beat is at most this old."),
        S("PI_FLEET_ROUTE_CACHE_SECONDS", "5", "Routing reads the registry at most this often per process."),
        S("PI_FLEET_CANCEL_ACK_SECONDS", "10", "How long fleet cancel waits for the running job's worker."),
        S("PI_FLEET_CANCEL_TTL_SECONDS", "604800", "How long a cancel request stays."),
        S("PI_FLEET_PANEL_REFRESH_SECONDS", "3", "The admin's fleet panel refreshes this often."),
    )),
    Section("Cron", "the cron producer", (
        S("PI_CRON_TZ", "UTC", "The time zone cron patterns are read in."),
    )),
)


def all_settings() -> list[Setting]:
    return [setting for section in SECTIONS for setting in section.settings]
