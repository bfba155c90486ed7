"""The worker's records: runs (one per attempt, PII-free), run logs, scoped limits, quiet hours, the settings row."""

from django.db import models

from apps.worker import validators


class Outcome(models.TextChoices):
    COMPLETED = "completed"
    POLICY = "policy"
    FAILED = "failed"


class LostRetry(models.TextChoices):
    """What became of an attempt whose worker died (apps/worker/process/worker_lost.py): run again as the next
    attempt, or not, and why not. Blank on every other attempt."""

    RETRIED = "retried"
    USED_UP = "used-up"  # the job's lost-worker retries (PI_LOST_RETRIES) are spent
    OFF = "off"  # PI_LOST_RETRIES is 0
    CANCELLED = "cancelled"  # an operator cancelled it: never run again


class ResumeReason(models.TextChoices):
    """Why a `run.resume` job started without its target's earlier session (apps/worker/sessions/)."""

    NO_SESSION = "no-session", "no session kept for this target yet"
    EXPIRED = "session-expired", "the kept session was older than PI_SESSION_TTL_DAYS"
    TOO_LARGE = "session-too-large", "the last session was larger than PI_SESSION_MAX_BYTES, so it was not kept"
    FORK = "fork", "a pull request from a fork never gets a session"
    STORE_UNAVAILABLE = "store-unavailable", "the session store (the database) did not answer"


class RunQuerySet(models.QuerySet):
    def previous_cron_run_at(self, job_id: str, trigger_id: int | None):
        """When the previous run of a cron job's trigger ended (`cron-<trigger id>-<seconds>`; its start when it has
        no end), or None. Through the trigger's index: a trigger's history, not the whole table's."""
        prefix = job_id.rsplit("-", 1)[0] + "-"
        run = (self.filter(trigger_id=trigger_id, job_id__startswith=prefix).exclude(job_id=job_id)
               .order_by("-started_at", "-id")
               .only("started_at", "ended_at").first())
        return None if run is None else (run.ended_at or run.started_at)

    """The questions asked of the run history, each answered from an index (see Run.Meta.indexes)."""

    def for_job(self, job_id: str):
        return self.filter(job_id=job_id).order_by("attempt")

    def since(self, instant):
        return self.filter(started_at__gte=instant)

    def started_before(self, instant):
        """The runs past their retention (apps/worker/housekeeping.py), oldest first by run_started_idx."""
        return self.filter(started_at__lt=instant)

    def cost_since(self, instant):
        """What the runs started since `instant` cost (the sum of their recorded cost; 0 with none)."""
        return self.since(instant).aggregate(cost=models.Sum("cost"))["cost"] or 0

    def failed_jobs_since(self, instant) -> int:
        """How many jobs had a failed attempt since `instant` (a job retried twice counts once)."""
        return self.since(instant).filter(outcome=Outcome.FAILED).values("job_id").distinct().count()

    def spent_by_trigger(self, trigger_id: int, *, other_than: str, since=None) -> bool:
        """Has another job of this trigger run (since it was armed)? A one-shot rule's question."""
        runs = self.filter(trigger_id=trigger_id).exclude(job_id=other_than)
        return (runs.since(since) if since is not None else runs).exists()

    def lost_retries(self, job_id: str, *, before: int | None = None) -> int:
        """How many of a job's attempts (before attempt `before`) were lost and run again (run_job_idx)."""
        runs = self.filter(job_id=job_id, lost_retry=LostRetry.RETRIED)
        return (runs.filter(attempt__lt=before) if before is not None else runs).count()

    def children_of(self, job_id: str) -> list[str]:
        """The job ids of the chained children that ran for this parent (run_parent_idx)."""
        return sorted(set(self.filter(parent_job_id=job_id).values_list("job_id", flat=True)))

    def latest_outcomes(self, job_ids) -> dict[str, tuple]:
        """Per job, its highest attempt's (pk, attempt, outcome, reason)."""
        latest: dict[str, tuple] = {}
        for job_id, pk, attempt, outcome, reason in (self.filter(job_id__in=list(job_ids)).order_by("job_id", "attempt")
                                                     .values_list("job_id", "pk", "attempt", "outcome", "reason")):
            latest[job_id] = (pk, attempt, outcome, reason)
        return latest

    def recently_published(self, limit: int):
        """The latest runs whose work reached the forge as a pull/merge request, newest first (run_published_idx)."""
        return self.filter(publish_outcome="published").exclude(publish_url="").order_by("-started_at")[:limit]


class Run(models.Model):
    """One attempt of one job (DESIGN section 8). Append-only and PII-free: ids, names and numbers only.

    A job that was deferred or removed before it ran has no row; every refusal, every terminal outcome
    and every infrastructure attempt has exactly one.
    """

    job_id = models.CharField(max_length=200)
    attempt = models.PositiveSmallIntegerField(default=1)
    kind = models.CharField(max_length=16)
    target = models.CharField(max_length=300, blank=True)
    scope = models.CharField(max_length=300, blank=True)
    flow = models.CharField(max_length=100, blank=True)
    command = models.CharField(max_length=200, blank=True)
    trigger = models.ForeignKey(
        "receiver.Trigger", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    trigger_type = models.CharField(max_length=32, blank=True)
    # The scoped limit whose cap refused the run (scope-cap, dollar-cap, cost-cap-unset); empty otherwise.
    refused_by_limit = models.ForeignKey(
        "worker.ScopedLimit", null=True, blank=True, on_delete=models.SET_NULL, related_name="refused_runs"
    )
    delivery_id = models.CharField(max_length=200, blank=True)
    host = models.CharField(max_length=64, blank=True)
    queue = models.CharField(max_length=100, blank=True)
    image = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    reason = models.CharField(max_length=64, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    turns = models.PositiveIntegerField(null=True, blank=True)
    tokens_in = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_out = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_total = models.PositiveBigIntegerField(null=True, blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    usage = models.JSONField(null=True, blank=True, help_text="Per-model usage ledger from the exit line.")
    budget_reserved = models.BooleanField(default=False)
    # The budget ledgers the attempt counted in: {"jobs": [...], "usd": [...]}, each `all` or `s:<hash16>` of a scoped
    # limit's scope (no names); the windows are rebuilt from these when Redis lost them (gates/budget_rebuild.py).
    ledgers = models.JSONField(null=True, blank=True)
    replica = models.PositiveSmallIntegerField(null=True, blank=True)
    replicas = models.PositiveSmallIntegerField(null=True, blank=True)
    parent_job_id = models.CharField(max_length=200, blank=True)
    # The project (Project.slug) the job was stamped with when it was enqueued, blank for none. Kept as text: a
    # project renamed or deleted later leaves its past runs where they were counted.
    project = models.CharField(max_length=32, blank=True, default="", db_default="")
    # Chaining (apps/worker/chaining/): how far below the job that started its chain this job is (0: it started
    # one), the children its completed run enqueued (job ids), and its refused requests ({reason token: count}).
    chain_depth = models.PositiveSmallIntegerField(default=0, db_default=0)
    # Nullable: a worker of the release before writes rows without them while the hosts roll.
    chain_children = models.JSONField(default=list, null=True, blank=True)
    chain_refusals = models.JSONField(default=dict, null=True, blank=True)
    # What the worker published for a completed forge run (apps/worker/forges/publishing/): `published` (a branch and a
    # pull/merge request, or the triggering PR's own branch), `commented`, `nothing-to-publish`, or a refusal.
    publish_outcome = models.CharField(max_length=40, blank=True)
    pull_request = models.PositiveIntegerField(null=True, blank=True, help_text="The PR/MR number published to.")
    pushed_commits = models.PositiveIntegerField(null=True, blank=True)
    changed_files = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="Paths the agent's work changed, pushed or not.")
    publish_url = models.URLField(max_length=500, blank=True, help_text="The pull/merge request or the comment.")
    # The forge's own words when it refused a request the run needed (forge-request-refused, forge-auth-refused, ...),
    # so the operator sees why. The one forge text a record keeps: the forge's error, not the or a person's,
    # bounded, and scrubbed of every token this deployment holds (apps/worker/records.py). It can name an account the
    # forge names (a branch's owner), so it is shown on the run page alone: never logged, posted or notified.
    forge_message = models.CharField("the forge said", max_length=500, blank=True, default="", db_default="",
                                     help_text="The forge's own message when it refused a request (bounded, scrubbed).")
    publish_refusal = models.CharField(
        "publishing refused for", max_length=300, blank=True, default="", db_default="",
        help_text="What the worker found when it refused to push (secret-in-work: the file or commit, and which "
                  "secret by its name, never its value).")
    # Dollar caps (apps/worker/gates/budget.py): what was held in the dollar windows before the container, what the
    # windows were charged after it, and how: `metered` (the gateway's metered cost), `floor` (the cost could
    # not be known: the whole hold stays charged), `refunded` (no container ran), `unreserved` (a per-job cap
    # but no window). Blank when no dollar cap applied.
    dollars_reserved = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    dollars_charged = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    dollar_basis = models.CharField(max_length=16, blank=True)
    # The length of the agent's last message; the text itself is kept only with the run's log (RunLog).
    summary_chars = models.PositiveIntegerField(null=True, blank=True)
    # An attempt whose worker died: whether it was run again as the next attempt (LostRetry), else blank.
    lost_retry = models.CharField(max_length=16, blank=True, default="", db_default="", choices=LostRetry.choices)
    # `run.resume` (apps/worker/sessions/): whether the agent continued its target's earlier session (None: the
    # trigger did not ask, or the job ended before its container), why not when it did not, and the size of the
    # session this run kept for the next one (None: nothing kept).
    resumed = models.BooleanField(null=True, blank=True)
    resume_reason = models.CharField(max_length=32, blank=True, default="", db_default="",
                                     choices=ResumeReason.choices)
    session_bytes = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="The session transcript this run kept for the next one.")
    # Until when the run's folder is kept on its host for `manage.py sandbox <job id>` (apps/worker/sandbox/
    # sandboxes.py); a pin there moves it later. Blank: no sandbox (off, a local run, or no container ran).
    sandbox_until = models.DateTimeField(null=True, blank=True)
    # The job's size (apps/worker/gates/host_budget.py), as the host budget admitted it and its container ran with:
    # `project` when its project row sized it, `default` from the settings. Blank when it ended before gate 5b.
    job_memory_mib = models.PositiveIntegerField("memory (MiB)", null=True, blank=True)
    job_cpus = models.DecimalField("CPUs", max_digits=6, decimal_places=2, null=True, blank=True)
    size_source = models.CharField(max_length=8, blank=True, default="", db_default="")

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["job_id", "attempt"], name="run_job_attempt_unique")]
        permissions = [("publish_run", "Can publish a run's kept work again"),
                       ("start_run", "Can start a run by hand (a forge's issue; a folder also needs start_folder_run)"),
                       # The agent may rewrite the folder: an administrator's power, as a trigger's folder is.
                       ("start_folder_run", "Can start a run on a folder of a worker host (the agent may rewrite "
                                            "the folder)")]
        indexes = [
            models.Index(fields=["-started_at"], name="run_started_idx"),
            models.Index(fields=["outcome", "-started_at"], name="run_outcome_idx"),
            models.Index(fields=["reason"], name="run_reason_idx"),
            models.Index(fields=["scope", "-started_at"], name="run_scope_idx"),
            models.Index(fields=["project", "-started_at"], name="run_project_idx", condition=~models.Q(project="")),
            models.Index(fields=["host", "-started_at"], name="run_host_idx"),
            models.Index(fields=["job_id"], name="run_job_idx"),
            models.Index(fields=["publish_outcome", "-started_at"], name="run_published_idx"),
            models.Index(fields=["parent_job_id"], name="run_parent_idx", condition=~models.Q(parent_job_id="")),
        ]

    def __str__(self):
        return f"{self.job_id} #{self.attempt} {self.outcome}"

    @property
    def cost_unknown(self) -> bool:
        """Tokens were spent and no price list priced them: the cost is unknown, never $0 (known_models.py)."""
        return self.cost is None and bool(self.tokens_total)

    @property
    def duration(self):
        return self.ended_at - self.started_at


class RunLog(models.Model):
    """A run's container output and the agent's summary, kept only with PI_CAPTURE_JOB_LOGS, scrubbed of every
    resolved secret value and the provider key, bounded by PI_JOB_LOG_MAX_BYTES, and deleted by the worker's
    sweep after PI_JOB_LOG_RETENTION_DAYS (apps/worker/run_logs.py). It holds issue text and the agent's
    output, which the Run record never does: reading it is a permission of its own."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="log")
    output = models.TextField(blank=True)
    summary = models.TextField(blank=True)
    output_bytes = models.PositiveBigIntegerField(default=0, help_text="The output's size before it was cut.")
    truncated = models.BooleanField(default=False)
    created_at = models.DateTimeField()

    class Meta:
        default_permissions = ()  # written by the worker only; reading is view_run_log
        permissions = [("view_run_log", "Can read a run's log (its container output and summary, which hold "
                                        "issue text and the agent's output)")]
        indexes = [models.Index(fields=["created_at"], name="runlog_created_idx")]

    def __str__(self):
        return f"log of {self.run_id}"


class RunChanges(models.Model):
    """What a completed forge run's agent changed (apps/worker/forges/publishing/changes.py): its paths with added
    and removed lines, its commits and its diff, scrubbed and bounded by PI_RUN_DIFF_MAX_BYTES, beside the summary
    that was posted on the forge. Code, not issue text; deleted with the run logs after PI_JOB_LOG_RETENTION_DAYS."""

    class Source(models.TextChoices):
        PUSHED = "pushed", "the commits pushed to the published branch"
        KEPT = "kept", "the commits kept on the worker host after publishing failed (Publish again)"
        NOT_PUBLISHED = "not-published", "the agent's commits, not published (a fork, or nothing pushed)"

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="changes")
    files = models.JSONField(default=list, help_text='[{"path", "added", "removed"}] (nulls: a binary file).')
    files_total = models.PositiveIntegerField(default=0)
    commits = models.JSONField(default=list, help_text='[{"sha", "subject"}], oldest first.')
    commits_total = models.PositiveIntegerField(default=0)
    diff = models.TextField(blank=True)
    diff_bytes = models.PositiveBigIntegerField(default=0, help_text="The diff's size before it was cut.")
    truncated = models.BooleanField(default=False)
    source = models.CharField(max_length=16, choices=Source.choices)
    summary = models.TextField(blank=True, help_text="The agent's summary as it was posted on the forge.")
    created_at = models.DateTimeField()

    class Meta:
        default_permissions = ()  # written by the worker only, read on the run's page
        verbose_name_plural = "run changes"
        indexes = [models.Index(fields=["created_at"], name="runchanges_created_idx")]

    def __str__(self):
        return f"changes of {self.run_id}"


class PauseWindow(models.Model):
    """Quiet hours: jobs in scope that would start inside the window wait until it ends (deferred, not refused)."""

    scope = models.CharField(
        max_length=500,
        help_text="owner/repo (every forge), github:owner/repo (one forge), an absolute folder, or * for everything.",
    )
    starts = models.TimeField("from", help_text="HH:MM, inclusive, in the window's time zone.")
    ends = models.TimeField("to", help_text="HH:MM, exclusive. Earlier than 'from' means the window runs overnight.")
    tz = models.CharField("time zone", max_length=64, default="UTC", help_text="IANA name, e.g. Europe/Amsterdam.")
    days = models.JSONField(
        default=list, blank=True,
        help_text="Weekdays an occurrence may start on; none ticked means every day.",
    )
    date_from = models.DateField(null=True, blank=True, help_text="First start date (inclusive).")
    date_to = models.DateField(null=True, blank=True, help_text="Last start date (inclusive).")
    enabled = models.BooleanField(default=True)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["scope", "starts"]

    def __str__(self):
        return f"{self.scope} {self.starts:%H:%M}-{self.ends:%H:%M} {self.tz}"

    def clean(self):
        from apps.worker.gates.quiet_hours import validate_window

        validate_window(self)


class ProjectQuerySet(models.QuerySet):
    def containing(self, scopes: list[str]):
        """The project one of `scopes` (a job's candidate scopes, narrowest first) is a member of, or None."""
        for project in self.order_by("slug"):
            if any(scope in project.members for scope in scopes):
                return project
        return None


class Project(models.Model):
    """A group of forge repositories and local folders whose runs are counted, capped (`project:<id>` scoped
    limits) and costed together. Each run records the project its job was enqueued under (Run.project)."""

    slug = models.CharField("id", max_length=32, unique=True, validators=[validators.project_slug],
                            help_text="1-32 lowercase letters, digits and '-'; scoped limits name it project:<id>.")
    name = models.CharField(max_length=200, blank=True)
    members = models.JSONField(
        default=list, validators=[validators.project_members],
        error_messages={"blank": "list at least one member: a forge-qualified repository or an absolute folder."},
        help_text="Forge-qualified repositories (github:owner/repo) and absolute folders; each in one project only.",
    )

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        default_permissions = ("view",)  # changes are a permission of their own (admin_mixins.py)
        permissions = [("manage_projects", "Can add, change and delete projects (which repositories and folders a "
                                           "project:<id> limit caps)")]

    def __str__(self):
        return self.slug

    def clean(self):
        validators.validate_project(self)

    def limits_naming_it(self):
        """The `project:<id>` scoped limits that name it: while any does, it may be neither deleted nor renamed
        (the cap would go on, capping nothing)."""
        slug = Project.objects.filter(pk=self.pk).values_list("slug", flat=True).first() or self.slug
        return ScopedLimit.objects.filter(scope=f"project:{slug}")


class ScopedLimit(models.Model):
    """Caps for one repository or folder: runs per UTC day/week/month, and how many of a repository's at once
    (fleet-wide; a folder's path names no repository across hosts, so a folder runs one at a time per host).
    A `project:<id>` row caps every member of a project together (and may size its containers); a
    `model:<provider>/<model>` row caps the dollars of every run that may call that model."""

    scope = models.CharField(
        max_length=500, unique=True,
        help_text="owner/repo (shared by every forge), github:owner/repo (one forge), an absolute folder, "
                  "project:<id> or model:<provider>/<model> (dollar windows only).",
    )
    day = models.PositiveIntegerField(null=True, blank=True, validators=[validators.limit_count],
                                      help_text="Runs per UTC day.")
    week = models.PositiveIntegerField(null=True, blank=True, validators=[validators.limit_count],
                                       help_text="Runs per UTC week (from Monday).")
    month = models.PositiveIntegerField(null=True, blank=True, validators=[validators.limit_count],
                                        help_text="Runs per UTC calendar month.")
    concurrent = models.PositiveIntegerField(
        null=True, blank=True, validators=[validators.limit_count],
        help_text="A repository's runs at the same time across all hosts; more wait, never refused. A folder runs "
                  "one job at a time on its own host, whatever this says.",
    )
    day_usd = models.DecimalField("day $", max_digits=13, decimal_places=6, null=True, blank=True,
                                  validators=[validators.dollar_amount],
                                  help_text="Dollars per UTC day (needs a per-job cap: PI_MAX_COST_USD).")
    week_usd = models.DecimalField("week $", max_digits=13, decimal_places=6, null=True, blank=True,
                                   validators=[validators.dollar_amount],
                                   help_text="Dollars per UTC week (from Monday).")
    month_usd = models.DecimalField("month $", max_digits=13, decimal_places=6, null=True, blank=True,
                                    validators=[validators.dollar_amount], help_text="Dollars per UTC calendar month.")
    # Version 3, project rows only: the project's containers' size (over PI_JOB_MEMORY / PI_JOB_CPUS), and its
    # share of a host's budget and the runs it keeps room for on each host (apps/worker/gates/host_budget.py).
    # db_default: a worker of the release before writes rows without it while the hosts roll.
    memory = models.CharField(max_length=16, blank=True, default="", db_default="",
                              validators=[validators.project_memory],
                              help_text="Project rows: each container's memory, 512m to 1024g (over PI_JOB_MEMORY).")
    cpus = models.DecimalField(max_digits=6, decimal_places=2, null=True, blank=True,
                               validators=[validators.project_cpus],
                               help_text="Project rows: each container's CPUs, at least 0.25 (over PI_JOB_CPUS).")
    host_share = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=validators.host_share_band,
        help_text="Project rows: the most of a host's budget (percent) its members' jobs use together there.")
    min_jobs = models.PositiveIntegerField(
        null=True, blank=True, validators=[validators.limit_count],
        help_text="Project rows: on each host, its oldest waiting job is held room for until this many of its jobs "
                  "run there (needs memory or cpus).")
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["scope"]
        default_permissions = ("view",)  # changes are a permission of their own (admin_mixins.py)
        permissions = [("manage_limits", "Can add, change and delete scoped limits (the caps and concurrency "
                                         "of a repository or folder)")]

    def __str__(self):
        return self.scope

    def clean(self):
        validators.validate_scoped_limit(self)


class DispatchSettings(models.Model):
    """Live-editable knobs. A blank field falls back to the environment, then the default."""

    daily_cap = models.PositiveIntegerField(null=True, blank=True, validators=[validators.setting_count],
                                            help_text="Runs per UTC day (PI_DAILY_CAP).")
    weekly_cap = models.PositiveIntegerField(null=True, blank=True, validators=[validators.setting_count],
                                             help_text="Runs per UTC week (PI_WEEKLY_CAP).")
    monthly_cap = models.PositiveIntegerField(null=True, blank=True, validators=[validators.setting_count],
                                              help_text="Runs per UTC month (PI_MONTHLY_CAP).")
    soft_hold_pct = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=validators.percent_band,
        help_text="1-99: once a window is past this share of its cap, new starts wait for the next window.",
    )
    max_turns = models.PositiveIntegerField(null=True, blank=True, validators=[validators.setting_count],
                                            help_text="Turns per run (PI_MAX_TURNS).")
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True, validators=[validators.setting_count],
                                                help_text="Tokens per run (PI_MAX_TOKENS).")
    daily_token_cap = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[validators.setting_count],
        help_text="Tokens per UTC day across all runs (PI_DAILY_TOKEN_CAP).",
    )
    job_memory = models.CharField(max_length=16, blank=True, validators=[validators.memory_size],
                                  help_text="Per-container memory, e.g. 4g (PI_JOB_MEMORY).")
    job_cpus = models.DecimalField(max_digits=5, decimal_places=2, null=True, blank=True,
                                   validators=[validators.cpu_count], help_text="Per-container CPUs (PI_JOB_CPUS).")
    concurrency = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[validators.setting_count],
        help_text="Containers one worker host runs at once, below its number of worker processes (PI_CONCURRENCY). "
                  "Every host applies a change to the next job it takes; running jobs finish.",
    )
    max_cost_usd = models.DecimalField(
        "max cost per run ($)", max_digits=13, decimal_places=6, null=True, blank=True,
        validators=[validators.dollar_amount],
        help_text="Dollars one run may spend (PI_MAX_COST_USD); the gateway stops it there (cost-cap). "
                  "Every dollar window needs it.")
    daily_cost_usd = models.DecimalField("dollars per day", max_digits=13, decimal_places=6, null=True, blank=True,
                                         validators=[validators.dollar_amount],
                                         help_text="Dollars per UTC day across all runs (PI_DAILY_COST_USD).")
    weekly_cost_usd = models.DecimalField("dollars per week", max_digits=13, decimal_places=6, null=True,
                                          blank=True, validators=[validators.dollar_amount],
                                          help_text="Dollars per UTC week (PI_WEEKLY_COST_USD).")
    monthly_cost_usd = models.DecimalField("dollars per month", max_digits=13, decimal_places=6, null=True,
                                           blank=True, validators=[validators.dollar_amount],
                                           help_text="Dollars per UTC month (PI_MONTHLY_COST_USD).")
    lost_retries = models.PositiveSmallIntegerField(
        "runs again after a lost worker", null=True, blank=True,
        help_text="How many times one job is run again, as a new attempt, after the worker running it died "
                  "(PI_LOST_RETRIES; 0: never). A lost attempt may have spent: its dollar hold stays charged.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "dispatch settings"
        default_permissions = ("view",)  # changes are a permission of their own (admin_mixins.py)
        permissions = [("manage_settings", "Can change the dispatch settings (deployment caps, per-run budgets, "
                                           "container memory and CPUs)")]

    def __str__(self):
        return "Dispatch settings"

    def save(self, *args, **kwargs):
        self.pk = 1  # one row: the deployment's overlay
        super().save(*args, **kwargs)

    def clean(self):
        validators.validate_dispatch_settings(self)


class AgentSessionQuerySet(models.QuerySet):
    def live(self, now):
        return self.filter(expires_at__gt=now)

    def expired(self, now):
        return self.filter(expires_at__lte=now)


class AgentSession(models.Model):
    """The last session transcript of pi on one target, for the next `run.resume` job there (apps/worker/sessions/).

    One row per target (`key`: a digest of forge, repository and issue or pull request; or of a cron trigger's
    id), written again by each completed run that resumes it. `transcript` is the scrubbed JSONL, zlib-compressed;
    empty when the run's session was larger than PI_SESSION_MAX_BYTES (`size` then says how large it was, so the
    next run can say `session-too-large`). The transcript holds the conversation (issue and comment text among
    it), as the queued job does: it is never shown in the admin, and it expires after PI_SESSION_TTL_DAYS.
    """

    key = models.CharField(max_length=64, unique=True)
    transcript = models.BinaryField(null=True, blank=True, editable=False)
    size = models.PositiveIntegerField(help_text="The transcript's size in bytes, uncompressed.")
    kept = models.BooleanField(default=True, help_text="False: it was larger than PI_SESSION_MAX_BYTES.")
    job_id = models.CharField(max_length=200, help_text="The job whose run wrote it.")
    host = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)

    objects = AgentSessionQuerySet.as_manager()

    class Meta:
        verbose_name = "agent session"

    def __str__(self) -> str:
        return f"session {self.key[:12]} ({self.job_id})"


class AcceptedJob(models.Model):
    """A job a producer acknowledged (a delivery's, a manual run's, a cron occurrence's, a chained child's): the
    database's copy of what Redis holds, written by the one enqueue function before the producer answers. Redis may
    lose its data; the reconciler (apps/worker/accepted.py) queues again under the same id every job of a row still
    open that Redis no longer holds. The payload holds the job's texts until the job settles (its last attempt is
    recorded, or an operator removed it), as the inbox holds a delivery's; then only the ids stay."""

    job_id = models.CharField(max_length=200, unique=True)
    queue = models.CharField(max_length=100)
    payload = models.JSONField(null=True, blank=True, editable=False)
    accepted_at = models.DateTimeField()
    # The attempt a worker started last and when (a job still running when Redis lost it is not queued again
    # while it may still run: see accepted.py).
    started_attempt = models.PositiveSmallIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    # When that attempt took its budget (its job-count slots and dollar hold): from then on a rebuild of the budget
    # windows counts it as in flight (gates/budget_rebuild.py).
    spending_since = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    rebuilt = models.PositiveSmallIntegerField(default=0, help_text="How often Redis lost it and it was queued again.")

    class Meta:
        default_permissions = ()  # written by producers and workers only; shown as counts (fleet panel, /metrics)
        indexes = [
            models.Index(fields=["accepted_at"], name="accepted_open_idx", condition=models.Q(settled_at__isnull=True)),
            models.Index(fields=["settled_at"], name="accepted_settled_idx",
                         condition=models.Q(settled_at__isnull=False)),
        ]

    def __str__(self):
        return self.job_id


class JobsRebuilt(models.Model):
    """One reconciliation that found accepted jobs Redis no longer held and queued them again: what an operator
    sees on the fleet panel and `/metrics` counts (`pidispatch_jobs_rebuilt_total`). Never pruned: one row per loss."""

    at = models.DateTimeField()
    jobs = models.PositiveIntegerField()
    redis_run = models.CharField(max_length=40, blank=True, help_text="The run id of the Redis they were rebuilt into.")

    class Meta:
        default_permissions = ()  # written by the reconciler only; shown on the fleet panel
        ordering = ["-at"]
        verbose_name_plural = "jobs rebuilt"

    def __str__(self):
        return f"{self.jobs} job(s) rebuilt at {self.at:%Y-%m-%d %H:%M:%S}"
