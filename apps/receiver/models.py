"""The receiver's records: triggers (the triggers.json language as rows) and the delivery inbox."""

from django.db import models
from django.db.models import Q
from django.utils import timezone

from apps import forge_registry

from .validation import validate_trigger_fields


class TriggerType(models.TextChoices):
    CRON = "cron", "cron (schedule)"
    LABEL = "label", "label"
    COMMENT = "comment", "comment"
    PULL_REQUEST = "pull_request", "pull request"
    ISSUE = "issue", "issue (close)"


RunKind = models.TextChoices("RunKind", [("LOCAL", ("local", "local folder (cron)")), *(
    (forge.name.upper(), (forge.name, forge.label)) for forge in forge_registry.FORGES)])


JSON_LIST_FIELDS = ("label_any", "label_all", "label_none", "actions", "review_states", "wait_for", "exclude_tools")
JSON_OBJECT_FIELDS = ("secrets",)


class TriggerQuerySet(models.QuerySet):
    def matching_order(self):
        """File order of the ancestor's triggers.json: the first matching rule wins."""
        return self.order_by("position", "id")

    def forge_rules(self):
        """Every rule a forge delivery can fire: enabled, not cron (schedules fire those), and not a spent
        one-shot (a disarmed rule matches nothing until an operator re-arms it)."""
        return (self.filter(enabled=True).exclude(on_type=TriggerType.CRON)
                .exclude(once=True, disarmed_at__isnull=False).matching_order())


class Trigger(models.Model):
    """One rule of the trigger language: `on` (what fires it) and `run` (what the job does).

    Field names follow the ancestor's `triggers.json` (most verbose names are its spelling; the list's columns,
    forge and type, are words), so `import_triggers` and `export_triggers` round-trip that file.
    """

    name = models.CharField(max_length=100, blank=True, default="", db_default="",
                            help_text="What the operators call the rule, e.g. Fix labelled bugs; shown in the "
                                      "trigger list and on its runs. Empty: its type and order.")
    position = models.PositiveIntegerField(
        "order", default=0,
        help_text="Rules are tried in this order; the first match wins (the ancestor's file order).",
    )
    enabled = models.BooleanField(default=True)
    note = models.CharField(max_length=200, blank=True, help_text="Operator's note; not shown to the agent.")

    # on.*
    on_type = models.CharField("type", max_length=32, choices=TriggerType.choices, default=TriggerType.LABEL)
    cron_id = models.CharField("on.id", max_length=64, blank=True, help_text="Cron: the schedule's unique name.")
    cron_pattern = models.CharField("on.pattern", max_length=120, blank=True,
                                    help_text='Cron: 5 fields, or 6 with seconds first, e.g. "0 6 * * 1-5" '
                                              '(in PI_CRON_TZ, default UTC).')
    label_any = models.JSONField(
        "on.any", default=list, blank=True, help_text="Fires when the item carries at least one of these labels."
    )
    label_all = models.JSONField(
        "on.all", default=list, blank=True, help_text="Fires only when the item carries every one of these labels."
    )
    label_none = models.JSONField(
        "on.none", default=list, blank=True, help_text="Never fires while the item carries any of these labels."
    )
    phrase = models.CharField("on.phrase", max_length=100, blank=True,
                              help_text='Comment: the text a comment must contain, e.g. "@pi" ("@pi <flow>" picks '
                                        "another known flow).")
    actions = models.JSONField("on.action", default=list, blank=True,
                               help_text="Pull request / issue: the forge's action words that fire this rule.")
    review_states = models.JSONField("on.reviewState", default=list, blank=True,
                                     help_text="GitHub review_submitted: approved, changes_requested, commented "
                                               "(empty = every verdict).")
    number = models.PositiveIntegerField("on.number", null=True, blank=True,
                                         help_text="Close rules: only this issue or pull request.")
    once = models.BooleanField("on.once", default=False,
                               help_text="Close rules with a number: fire once, then the rule disarms itself.")
    armed_at = models.DateTimeField(null=True, blank=True, editable=False,
                                    help_text="When the one-shot rule was last armed; older runs cannot spend it.")
    disarmed_at = models.DateTimeField("on.disarmed.at", null=True, blank=True, editable=False)
    disarmed_job_id = models.CharField("on.disarmed.jobId", max_length=200, blank=True, editable=False)

    # run.*
    kind = models.CharField("forge", max_length=16, choices=RunKind.choices)
    flow = models.CharField("run.flow", max_length=64, blank=True, help_text="The pi skill the job runs.")
    command = models.CharField("run.command", max_length=200, blank=True,
                               help_text="Instead of a flow: a pi extension command (no leading '/').")
    task = models.TextField("run.task", blank=True, help_text="Cron with a flow: the job's prompt.")
    folder = models.CharField("run.folder", max_length=500, blank=True,
                              help_text="Cron: the folder on the worker host the job works in.")
    image = models.CharField("run.image", max_length=300, blank=True, help_text="Job image override.")
    instructions = models.TextField("run.instructions", blank=True,
                                    help_text="Forge rules: standing operator text above the issue text (at most "
                                              "2000 characters).")
    replicas = models.PositiveSmallIntegerField("run.replicas", null=True, blank=True,
                                                help_text="2 or 3 parallel jobs per event (empty = one).")
    wait_for = models.JSONField("run.waitFor", default=list, blank=True,
                                help_text='Hold the job: [{"after": "<ISO instant>"}, {"profile": "<name>"}].')
    secrets = models.JSONField("run.secrets", default=dict, blank=True,
                               help_text="NAME: reference pairs the worker resolves (references only, never values).")
    secrets_profile = models.CharField("run.secretsProfile", max_length=64, blank=True,
                                       help_text="The host-local resolver for run.secrets.")
    repository = models.CharField("run.repository", max_length=200, blank=True,
                                  help_text="Azure DevOps label/comment rules: the repository the job works on.")
    exclude_tools = models.JSONField("run.excludeTools", default=list, blank=True)
    provider = models.CharField("run.provider", max_length=64, blank=True)
    model = models.CharField("run.model", max_length=64, blank=True)
    allowed_models = models.JSONField(
        "run.models", default=list, db_default=[], blank=True,
        help_text="The models the agent may call, 1-16 provider/model entries (empty: PI_ALLOWED_MODELS, else any); "
                  "the gateway refuses any other (model-not-allowed).")
    max_turns = models.PositiveIntegerField("run.maxTurns", null=True, blank=True)
    max_cost_usd = models.DecimalField(
        "run.maxCostUsd", max_digits=13, decimal_places=6, null=True, blank=True,
        help_text="Dollars one run of this rule may spend: lowers the deployment's per-run cap (PI_MAX_COST_USD), "
                  "never raises it.")
    allow_ci_changes = models.BooleanField(
        "run.allowCiChanges", default=False,
        help_text="Let the agent's work change CI definitions (.github/workflows/, .gitlab-ci.yml, ...). Off: such a "
                  "change is not pushed (ci-change-refused) and the work is kept for the operator.")
    publish_to = models.CharField(
        "run.publishTo", max_length=8, blank=True, default="", db_default="",
        choices=[("", "the deployment's default (PI_PUBLISH_TO)"), ("origin", "origin"), ("fork", "fork")],
        help_text="Where the agent's branch is pushed. fork: the deployment's own fork, its pull request an outside "
                  "contribution, so the origin's CI gives it no secret until a person approves it (GitHub, "
                  "GitLab, Forgejo, Azure DevOps with AZURE_FORK_PROJECT; credentials that cannot fork refuse the "
                  "job fork-unavailable). origin: a branch of the "
                  "repository itself, where push and pull-request CI runs the agent's code with the repository's "
                  "secrets.")
    packages = models.BooleanField(
        "run.packages", default=True, db_default=True,
        help_text="Load the pi packages staged in the worker's overlay (PI_GLOBAL_PI_DIR). Off: the job runs without "
                  "them (third-party code stays out of this rule's jobs).")
    skills_dir = models.CharField(
        "run.skillsDir", max_length=500, blank=True, default="", db_default="",
        help_text="A folder of skills on the worker host, under a root it declares (PI_SKILLS_ROOTS), copied into "
                  "each job as any user of the host may read it (the same bounds as a repository's .pi/). Setting "
                  "it needs the permission to set skills folders.")
    github = models.BooleanField(
        "run.github", default=False, db_default=False,
        help_text="Cron: publish the job's commits to the folder's GitHub repository (its origin) as a branch and a "
                  "pull request, by the worker; the container still holds no token.")
    backend = models.CharField(
        "run.backend", max_length=32, blank=True, default="", db_default="",
        help_text="The venue the job runs on (empty: local, the host's Docker engine); the host must bless it in "
                  "PI_BACKENDS.")
    resume = models.BooleanField("run.resume", default=False,
                                 help_text="Continue the agent's conversation: the next job on the same issue or "
                                           "pull request (a cron trigger: its next run) starts from the session this "
                                           "one kept. Never for a fork's pull request; not with replicas, secrets "
                                           "or a command.")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TriggerQuerySet.as_manager()

    class Meta:
        ordering = ["position", "id"]
        indexes = [models.Index(fields=["kind", "on_type", "enabled", "position"], name="trigger_match_idx")]
        # A trigger picks what a worker host runs: changing one is a permission of its own (admin_mixins.py).
        default_permissions = ("view",)
        permissions = [("manage_triggers", "Can add, change and delete triggers (a trigger chooses the folder, "
                                           "image and secret references a job uses on a worker host)"),
                       ("set_skills_dir", "Can point a trigger at a skills folder (run.skillsDir), a worker host's "
                                          "folder copied into each of its jobs")]

    def __str__(self):
        if self.name:
            return self.name
        return f"#{self.position} {self.kind} {self.on_type} -> {self.flow or '/' + self.command}"

    def normalise_empty_values(self) -> None:
        # JSON fields left empty in a form arrive as None; the rule means "not set".
        for name in JSON_LIST_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, [])
        for name in JSON_OBJECT_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, {})

    def clean(self):
        self.normalise_empty_values()
        validate_trigger_fields(self)
        self._validate_against_other_rules()

    def _validate_against_other_rules(self):
        from django.core.exceptions import ValidationError

        others = Trigger.objects.exclude(pk=self.pk)
        if self.on_type == TriggerType.COMMENT and others.filter(on_type=TriggerType.COMMENT, kind=self.kind).exists():
            raise ValidationError({"on_type": (
                f"There is already a comment trigger for {self.kind}: one comment trigger per forge (a comment picks "
                "another flow with `<phrase> <flow>`).")})
        if self.on_type == TriggerType.CRON and others.filter(on_type=TriggerType.CRON, cron_id=self.cron_id).exists():
            raise ValidationError({"cron_id": f"cron id {self.cron_id!r} is already used; cron ids are unique."})

    def save(self, *args, **kwargs):
        self.normalise_empty_values()
        if not self.once:
            self.armed_at, self.disarmed_at, self.disarmed_job_id = None, None, ""
        elif self.armed_at is None:
            self.armed_at = timezone.now()  # a new one-shot is armed from now on
        super().save(*args, **kwargs)

    # --- state ---

    @property
    def disarmed(self) -> bool:
        return self.once and self.disarmed_at is not None

    # --- the label predicate ---

    def labels_match(self, labels) -> bool:
        """(any is empty or hit) and all present and none absent."""
        present = set(labels)
        return (
            (not self.label_any or bool(present.intersection(self.label_any)))
            and set(self.label_all) <= present
            and not present.intersection(self.label_none)
        )

    def matched_label(self, labels) -> str | None:
        present = set(labels)
        hit = next((name for name in self.label_any if name in present), None)
        return hit or (self.label_all[0] if self.label_all else None)

    @property
    def has_positive_selector(self) -> bool:
        return bool(self.label_any or self.label_all)


class DeliveryStatus(models.TextChoices):
    RECEIVED = "received", "received (being processed)"
    PENDING = "pending", "pending (will be retried)"
    QUEUED = "queued"
    DUPLICATE = "duplicate", "duplicate (dedup window)"
    IGNORED = "ignored"
    REJECTED = "rejected", "rejected (malformed)"
    DISCARDED = "discarded", "discarded by an operator"


SETTLED_STATUSES = (DeliveryStatus.QUEUED, DeliveryStatus.DUPLICATE, DeliveryStatus.IGNORED,
                    DeliveryStatus.REJECTED, DeliveryStatus.DISCARDED)


class DeliveryQuerySet(models.QuerySet):
    def replay_order(self):
        return self.order_by("received_at", "id")

    def holding_payload(self):
        return self.filter(payload__isnull=False)

    def settled_before(self, instant):
        """Deliveries settled (queued, duplicate, ignored, rejected, discarded) and received before `instant`: never
        one still in hand or pending, whatever its age (apps/worker/housekeeping.py)."""
        return self.filter(status__in=SETTLED_STATUSES, received_at__lt=instant)


class Delivery(models.Model):
    """The inbox: every verified delivery, stored before anything else happens.

    The payload copy exists only until the delivery settles (queued, duplicate, ignored, rejected or
    discarded); afterwards the row keeps ids and the outcome only. A pending delivery keeps its payload
    and is retried (`manage.py replay_deliveries`).
    """

    forge = models.CharField(max_length=16)
    delivery_id = models.CharField(max_length=200)
    event = models.CharField(max_length=64, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.RECEIVED)
    reason = models.CharField(max_length=64, blank=True)
    job_ids = models.JSONField(default=list, blank=True)
    payload = models.BinaryField(null=True, blank=True, editable=False)
    attempts = models.PositiveIntegerField(default=0, help_text="How often the delivery has been processed.")
    attempted_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True, help_text="Pending: when it is retried next.")

    objects = DeliveryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-received_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["forge", "delivery_id"], name="delivery_forge_id_unique")]
        indexes = [
            models.Index(fields=["status", "received_at"], name="delivery_status_idx"),
            models.Index(fields=["status", "reason"], name="delivery_pending_idx",
                         condition=Q(status="pending")),
        ]

    def __str__(self):
        return f"{self.forge}:{self.delivery_id}"

    @property
    def holds_payload(self) -> bool:
        return self.payload is not None


class PollCursor(models.Model):
    """Where the GitHub poller (`manage.py poll_github`, apps/receiver/polling/) is in one repository's feeds:
    ids, times, head shas and HTTP validators only. A restart resumes from here, so it neither loses nor repeats
    an event (a repeat would also be answered from the inbox: the poller's delivery ids are the events' own)."""

    repo = models.CharField(max_length=200, unique=True, help_text="owner/name on GitHub.")
    armed_at = models.DateTimeField(null=True, blank=True,
                                    help_text="When the poller first read it; nothing older starts work.")
    events_id = models.BigIntegerField(default=0, help_text="The newest issue event handled.")
    comments_since = models.DateTimeField(null=True, blank=True,
                                          help_text="The comments feed is read from this update time on.")
    comments_id = models.BigIntegerField(default=0, help_text="The newest issue comment handled.")
    pulls = models.JSONField(default=dict, blank=True,
                             help_text='Open pull requests as last seen: number -> head sha, or "closed".')
    etags = models.JSONField(default=dict, blank=True, help_text="Each feed's ETag, sent as If-None-Match.")
    polled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["repo"]

    def __str__(self):
        return self.repo
