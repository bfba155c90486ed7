"""The worker's records in the admin: runs (explained, attempts grouped, Publish again), projects, scoped limits, quiet
hours, settings."""

from datetime import timedelta
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Count, OuterRef, Subquery
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from apps.fleet import job_states
from apps.fleet.connection import get_redis
from apps.worker import reasons, run_logs, validators
from apps.worker.forges.publishing import kept
from apps.worker.gates import runtime_settings
from apps.worker.jobs import KINDS
from apps.worker.models import AgentSession, DispatchSettings, PauseWindow, Project, Run, RunChanges, ScopedLimit
from apps.worker.pause_window_form import DAY_NAMES, PauseWindowForm
from apps.worker.progress import reading as progress_reading
from apps.worker.progress import views as progress_views
from pidispatch_site import admin_display
from pidispatch_site.admin_mixins import ManagedChangesAdmin, PlainHelpTextsAdmin, ReadOnlyAdminMixin


class RecentValuesFilter(admin.SimpleListFilter):
    """Offers the values a field took in the last RECENT_DAYS of runs.

    Django's default field filter lists the distinct values of the whole table on every page view: a full
    scan per filter over a long history. The recent window is an index range (run_started_idx).
    """

    field = ""
    RECENT_DAYS = 30

    def lookups(self, request, model_admin):
        since = timezone.now() - timedelta(days=self.RECENT_DAYS)
        values = (Run.objects.filter(started_at__gte=since).exclude(**{self.field: ""})
                  .order_by(self.field).values_list(self.field, flat=True).distinct())
        return [(value, value) for value in values]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


def recent_values_filter(field: str, title: str) -> type[RecentValuesFilter]:
    return type(f"Recent{field.title().replace('_', '')}Filter", (RecentValuesFilter,),
                {"field": field, "title": title, "parameter_name": field})


class KindFilter(admin.SimpleListFilter):
    title = parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [(kind, kind) for kind in KINDS]

    def queryset(self, request, queryset):
        return queryset.filter(kind=self.value()) if self.value() else queryset


class EstimatedCountPaginator(Paginator):
    """On PostgreSQL an unfiltered run history is counted from the planner's estimate: an exact COUNT(*)
    over millions of rows on every page view buys a page count nobody needs to the unit."""

    @cached_property
    def count(self):
        query = getattr(self.object_list, "query", None)
        if connection.vendor == "postgresql" and query is not None and not query.where:
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                               [Run._meta.db_table])
                estimate = cursor.fetchone()[0]
            if estimate > 100_000:  # below that an exact count is cheap
                return estimate
        return super().count


def _diff_line_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff --git", "index ")):
        return "meta"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")


def _diff_lines(diff: str) -> str:
    """The diff with its added and removed lines marked, as a forge's diff view shows them."""
    return format_html_join("", '<span class="{}">{}</span>\n',
                            ((_diff_line_class(line), line) for line in diff.split("\n")))


def _attempts_of(job_id):
    return Run.objects.filter(job_id=job_id)


def _published_url(run: Run) -> str:
    return admin_display.published_url(run.kind, run.target, run.pull_request, run.publish_url, run.publish_outcome)


@admin.register(Run)
class RunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Run history: read-only, because a run record is append-only evidence.

    Each row says which attempt of its job it was and why the one before failed; the page explains the reason
    from the one reason table (reasons.py) and links the run's other attempts, its delivery and its trigger.
    """

    list_display = (
        "job", "attempt_display", "target_display", "flow_or_command", "outcome_display", "published", "host",
        "duration_display", "tokens", "cost_display", "started_display",
    )
    actions = ["publish_again"]
    list_filter = (
        "outcome", recent_values_filter("reason", "reason"), KindFilter, recent_values_filter("host", "host"),
        recent_values_filter("trigger_type", "trigger type"), recent_values_filter("project", "project"), "started_at",
    )
    search_fields = ("job_id", "target", "delivery_id", "scope")
    paginator = EstimatedCountPaginator
    list_select_related = ("trigger",)
    list_per_page = 50
    show_full_result_count = False  # a count(*) over a long history on every page view is wasted work

    class Media:
        css = {"all": ("worker/admin.css",)}

    # Every recorded field is on the page; numbers, times and targets in their readable form (`*_display`).
    fieldsets = (
        (None, {"fields": ("job_id", "attempt", "attempts_display", "outcome", "reason", "explanation",
                           "forge_message", "publish_refusal", "refused_by_limit_display", "lost_retry_display",
                           "forge_sentence", "exit_code")}),
        ("What it did", {"fields": ("publish_outcome", "publish_display", "pull_request", "pushed_commits",
                                    "changed_files", "agent_summary", "summary_chars")}),
        # The agent's paths, commits and diff (apps/worker/forges/publishing/changes.py), beside what was posted.
        ("What the agent changed", {"fields": ("changes_display",)}),
        ("What ran", {"fields": ("kind", "target_display", "scope", "project", "flow", "command", "image",
                                 "replica", "replicas")}),
        # Its size as the host budget admitted it and its container ran with (apps/worker/gates/host_budget.py).
        ("Size", {"fields": ("job_memory_mib", "job_cpus", "size_source")}),
        # Chaining (apps/worker/chaining/): the job that asked for this one, and the jobs this one asked for.
        ("Chain", {"fields": ("chain_depth", "parent_job_display", "chain_children_display",
                              "chain_refusals_display")}),
        ("Where and when", {"fields": ("host", "queue", "started_display", "ended_display", "duration_display",
                                       "sandbox_until_display")}),
        ("Why it ran", {"fields": ("trigger", "trigger_type", "delivery_display")}),
        ("Spend", {"fields": ("turns", "tokens_in", "tokens_out", "tokens_total", "cost_display", "usage_display",
                              "budget_reserved", "ledgers")}),
        # Dollar caps and run logs (apps/worker/gates/budget.py, apps/worker/run_logs.py).
        ("Dollars", {"fields": ("dollar_basis", "dollars_reserved", "dollars_charged")}),
        # `run.resume` (apps/worker/sessions/): whether it continued its target's session, and why not.
        ("Session", {"fields": ("resumed_display", "session_bytes")}),
        ("Log", {"fields": ("view_log",)}),
    )

    @admin.display(description="resumed")
    def resumed_display(self, run: Run) -> str:
        if run.resumed is None:
            return "not asked (the trigger has no run.resume), or it ended before its container"
        if run.resumed:
            return "yes: the agent continued the session its target's last completed run kept"
        return f"no: {run.get_resume_reason_display()} ({run.resume_reason})"

    @admin.display(description="sandbox")
    def sandbox_until_display(self, run: Run) -> str:
        """Where a look inside the run's workspace is (apps/worker/sandbox/sandboxes.py), until when, and how."""
        if run.sandbox_until is None:
            return "none kept (no container ran, a folder's run, or PI_SANDBOX_RETENTION_HOURS=0 on its host)"
        later = Run.objects.filter(job_id=run.job_id, attempt__gt=run.attempt).order_by("-attempt").first()
        if later is not None:
            return f"replaced by attempt {later.attempt}'s folder"
        if run.sandbox_until <= timezone.now():
            return f"expired {admin_display.instant(run.sandbox_until)}"
        return format_html("on host <strong>{}</strong> until {}: <code>python manage.py sandbox {}</code> "
                           "on that host (<code>--pin</code> keeps it longer)", run.host,
                           admin_display.instant(run.sandbox_until), run.job_id)

    @admin.display(description="log")
    def view_log(self, run: Run) -> str:
        return run_logs.admin_link(run)

    @admin.display(description="the agent's summary")
    def agent_summary(self, run: Run) -> str:
        # Shown only to readers of run logs (run_logs.admin_fieldsets): it is the agent's words about the issue.
        summary = run_logs.kept_summary(run)
        if summary is None:
            return (f"{run.summary_chars} characters, not kept (PI_CAPTURE_JOB_LOGS)" if run.summary_chars
                    else "none kept")
        return format_html('<div class="agent-summary" style="white-space: pre-wrap">{}</div>', summary)

    def get_fieldsets(self, request, obj=None):
        return run_logs.admin_fieldsets(super().get_fieldsets(request, obj), request.user)

    def get_urls(self):
        # A job's page (live while it is queued or runs, its attempts once recorded) and the JSON it polls.
        wrap = self.admin_site.admin_view
        return [
            path("job/<str:job_id>/", wrap(lambda request, job_id: progress_views.live_page(
                request, job_id, admin_context={**self.admin_site.each_context(request), "opts": self.opts})),
                name="worker_run_live"),
            path("job/<str:job_id>/progress.json", wrap(progress_views.progress_json), name="worker_run_progress"),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        # Running jobs have no record yet: they are listed above the history, from their workers' progress.
        running = progress_reading.running_now() if not request.GET.get("job_id") else []
        return super().changelist_view(request, {**(extra_context or {}), "running_now": running})

    def get_queryset(self, request):
        # Per row: how many attempts its job has, and why the attempt before it ended (run_job_idx lookups).
        siblings = Run.objects.filter(job_id=OuterRef("job_id"))
        return super().get_queryset(request).annotate(
            attempts_total=Subquery(siblings.values("job_id").annotate(n=Count("id")).values("n")[:1]),
            retried_after=Subquery(siblings.filter(attempt=OuterRef("attempt") - 1).values("reason")[:1]),
        )

    # --- list columns ----------------------------------------------------------------------------------------

    @admin.display(description="job", ordering="job_id")
    def job(self, run: Run) -> str:
        return admin_display.short_id(run.job_id)

    @admin.display(description="attempt", ordering="attempt")
    def attempt_display(self, run: Run) -> str:
        total = getattr(run, "attempts_total", None) or run.attempt
        if total <= 1:
            return "1"
        text = f"{run.attempt} of {total}"
        if run.attempt > 1:
            text += f", retried after {getattr(run, 'retried_after', '') or 'a failure'}"
        url = reverse("admin:worker_run_changelist") + "?" + urlencode({"job_id": run.job_id})
        return format_html('<a href="{}" title="every attempt of this job">{}</a>', url, text)

    @admin.display(description="target", ordering="target")
    def target_display(self, run: Run) -> str:
        return admin_display.target_link(run.kind, run.target)

    @admin.display(description="outcome", ordering="outcome")
    def outcome_display(self, run: Run) -> str:
        if not run.reason:
            return format_html('<span class="outcome outcome-{}">{}</span>', run.outcome, run.outcome)
        reason = reasons.explain(run.reason)
        hover = f"{reason.means} Next: {reason.next_step}" if reason else "No explanation recorded for this reason."
        return format_html('<span class="outcome outcome-{}">{}</span><br><span class="reason" title="{}">{}</span>',
                           run.outcome, run.outcome, hover, run.reason)

    @admin.display(description="published", ordering="publish_outcome")
    def published(self, run: Run) -> str:
        if url := _published_url(run):
            label = f"{run.publish_outcome} #{run.pull_request}" if run.pull_request else run.publish_outcome
            return format_html('<a href="{}">{}</a>', url, label)
        return run.publish_outcome or "-"

    @admin.display(description="tokens", ordering="tokens_total")
    def tokens(self, run: Run):
        return run.tokens_total if run.tokens_total is not None else "-"

    @admin.display(description="cost", ordering="cost")
    def cost_display(self, run: Run) -> str:
        return "unknown (a model without a price)" if run.cost_unknown else admin_display.money(run.cost)

    @admin.display(description="started", ordering="started_at")
    def started_display(self, run: Run) -> str:
        return admin_display.instant(run.started_at)

    @admin.display(description="ended", ordering="ended_at")
    def ended_display(self, run: Run) -> str:
        return admin_display.instant(run.ended_at)

    @admin.display(description="flow", ordering="flow")
    def flow_or_command(self, run: Run) -> str:
        return run.flow or (f"cmd:{run.command}" if run.command else "")

    @admin.display(description="duration", ordering="ended_at")
    def duration_display(self, run: Run) -> str:
        seconds = run.duration.total_seconds()
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    # --- the run page ---------------------------------------------------------------------------------------

    @admin.display(description="what it means")
    def explanation(self, run: Run) -> str:
        reason = reasons.explain(run.reason) or reasons.explain(run.publish_outcome)
        if reason is None:
            return "The run completed." if run.outcome == "completed" else f"No explanation for {run.reason!r} yet."
        return format_html("{}<br><strong>Next:</strong> {}", reason.means, reason.next_step)

    @admin.display(description="refused by the limit")
    def refused_by_limit_display(self, run: Run) -> str:
        """The scoped limit whose cap refused the run, linked to its page (scope-cap, dollar-cap, cost-cap-unset)."""
        if run.refused_by_limit_id is None:
            return "-"
        url = reverse("admin:worker_scopedlimit_change", args=[run.refused_by_limit_id])
        return format_html('<a href="{}">{}</a>', url, run.refused_by_limit)

    @admin.display(description="after its worker died")
    def lost_retry_display(self, run: Run) -> str:
        text = reasons.lost_retry_text(run.lost_retry, run.attempt)
        if not text:
            return "-"
        retry = _attempts_of(run.job_id).filter(attempt=run.attempt + 1).values_list("pk", flat=True).first()
        if retry is None:
            return text
        return format_html('{} (<a href="{}">attempt {}</a>)', text, reverse("admin:worker_run_change", args=[retry]),
                           run.attempt + 1)

    @admin.display(description="posted on the issue")
    def forge_sentence(self, run: Run) -> str:
        from apps.worker.forges.comments import sentence_for

        if run.kind == "local":
            return "Local run: nothing is posted (the sentence goes to the worker log)."
        text = sentence_for(run)
        if url := _published_url(run):
            return format_html('{} <a href="{}">the pull request or comment</a>',
                               text or "The agent's summary, published:", url)
        if text is None:
            return "Nothing: a failed attempt that is retried, or a completed run, posts no status sentence."
        url = admin_display.target_url(run.kind, run.target)
        return format_html('{} <a href="{}">on {}</a>', text, url, run.target) if url else text

    @admin.display(description="attempts of this job")
    def attempts_display(self, run: Run) -> str:
        rows = list(_attempts_of(run.job_id).order_by("attempt")
                    .values_list("pk", "attempt", "outcome", "reason", "lost_retry"))
        attempts = format_html_join(
            mark_safe(" · "), '<a href="{}"{}>attempt {}: {} {}{}</a>',
            ((reverse("admin:worker_run_change", args=[pk]), mark_safe(' class="current"') if pk == run.pk else "",
              attempt, outcome, reason, f" ({text})" if (text := reasons.lost_retry_text(lost_retry, attempt)) else "")
             for pk, attempt, outcome, reason, lost_retry in rows))
        # The job's page: its phases (live while a later attempt is queued or runs) and every attempt.
        return format_html('{} · <a class="job-page" href="{}">the job\'s page (live while it runs)</a>', attempts,
                           reverse("admin:worker_run_live", args=[run.job_id]))

    @admin.display(description="parent job")
    def parent_job_display(self, run: Run) -> str:
        if not run.parent_job_id:
            return "-"
        return self._job_link(run.parent_job_id, Run.objects.latest_outcomes([run.parent_job_id]))

    @admin.display(description="children")
    def chain_children_display(self, run: Run) -> str:
        children = list(dict.fromkeys([*(run.chain_children or []), *Run.objects.children_of(run.job_id)]))
        if not children:
            return "-"
        latest = Run.objects.latest_outcomes(children)
        return format_html_join(mark_safe(" · "), "{}", ((self._job_link(child, latest),) for child in children))

    @admin.display(description="refused requests")
    def chain_refusals_display(self, run: Run) -> str:
        if not run.chain_refusals:
            return "-"
        return ", ".join(f"{reason} ×{count}" for reason, count in sorted(run.chain_refusals.items()))

    @staticmethod
    def _job_link(job_id: str, latest: dict) -> str:
        if job_id not in latest:
            return format_html('<span class="chain-job">{} (not run yet)</span>', job_id)
        pk, attempt, outcome, reason = latest[job_id]
        return format_html('<a class="chain-job" href="{}">{} ({}{})</a>',
                           reverse("admin:worker_run_change", args=[pk]), job_id, outcome,
                           f" {reason}" if reason else "")

    @admin.display(description="published to")
    def publish_display(self, run: Run) -> str:
        if url := _published_url(run):
            return format_html('<a href="{}">{}</a>', url, url)
        return "-" if not run.publish_outcome else "nothing reached the forge"



    @admin.display(description="delivery")
    def delivery_display(self, run: Run) -> str:
        """The inbox row the run came from (its id as the forge sent it), with the inbox's status."""
        if not run.delivery_id:
            return "-" if run.trigger_type != "manual" else "started by hand"
        from apps.receiver.models import Delivery

        delivery = (Delivery.objects.filter(forge=run.kind, delivery_id=run.delivery_id)
                    .only("pk", "status", "job_ids").first())
        if delivery is None:
            return f"{run.delivery_id} (no longer in the inbox)"
        status = delivery.status
        if status == "queued" and delivery.job_ids:
            states = job_states.job_states(get_redis(), delivery.job_ids)
            status = f"queued → {job_states.overall(states, delivery.job_ids)}"
        return format_html('<a href="{}">{} ({})</a>', reverse("admin:receiver_delivery_change", args=[delivery.pk]),
                           run.delivery_id, status)

    @admin.display(description="changes")
    def changes_display(self, run: Run) -> str:
        changes = RunChanges.objects.filter(run=run).first()
        if changes is None:
            if run.changed_files:
                return (f"{run.changed_files} path(s) changed; their diff is no longer kept "
                        f"(past PI_JOB_LOG_RETENTION_DAYS, or recorded by an earlier version)")
            return "none (no forge work to publish, or the run did not complete)"
        added = sum(entry.get("added") or 0 for entry in changes.files)
        removed = sum(entry.get("removed") or 0 for entry in changes.files)
        files = format_html_join("", '<tr><td class="path"><code>{}</code></td><td class="added">{}</td>'
                                     '<td class="removed">{}</td></tr>', (
            (entry["path"], "bin" if entry.get("added") is None else f"+{entry['added']}",
             "" if entry.get("removed") is None else f"-{entry['removed']}") for entry in changes.files))
        more_files = changes.files_total - len(changes.files)
        commits = format_html_join("", "<li><code>{}</code> {}</li>", (
            (commit["sha"][:12], commit["subject"]) for commit in changes.commits))
        cut = (f" (cut: {changes.diff_bytes} bytes of diff, PI_RUN_DIFF_MAX_BYTES "
               f"{settings.PI_RUN_DIFF_MAX_BYTES}; large files left out first)" if changes.truncated else "")
        summary = (format_html('<div class="posted-summary"><strong>Posted on the forge:</strong>'
                               '<div style="white-space: pre-wrap">{}</div></div>', changes.summary)
                   if changes.summary else "")
        return format_html(
            '<div class="run-changes"><p>{} · {} path(s), <span class="added">+{}</span> '
            '<span class="removed">-{}</span>, {} commit(s)</p>'
            '<table class="changed-files"><tbody>{}</tbody></table>{}'
            '<ol class="commits">{}</ol>{}'
            '<details class="diff"{}><summary>Diff{}</summary><pre class="diff">{}</pre></details></div>',
            changes.get_source_display(), changes.files_total, added, removed, changes.commits_total, files,
            format_html("<p>and {} more path(s)</p>", more_files) if more_files > 0 else "", commits, summary,
            mark_safe(" open") if len(changes.diff) < 20_000 else "", cut, _diff_lines(changes.diff))

    @admin.display(description="usage by model")
    def usage_display(self, run: Run) -> str:
        models = (run.usage or {}).get("models") if isinstance(run.usage, dict) else None
        if not models:
            return "-" if not run.usage else str(run.usage)  # a ledger of another shape: shown as recorded
        columns = ("calls", "input", "output", "cacheRead", "cacheWrite", "total", "cost")
        head = format_html_join("", "<th>{}</th>", ((name,) for name in ("model", *columns)))
        body = format_html_join("", "<tr><td>{}</td>{}</tr>", (
            (f"{row.get('provider', '?')}/{row.get('model', '?')}",
             format_html_join("", "<td>{}</td>", (
                 (admin_display.money(row.get(name)) if name == "cost" else row.get(name, "-"),)
                 for name in columns)))
            for row in models if isinstance(row, dict)))
        return format_html('<table class="usage"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, body)

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields] + [
            "duration_display", "explanation", "forge_sentence", "attempts_display", "target_display",
            "publish_display", "delivery_display", "cost_display", "usage_display", "started_display",
            "ended_display", "view_log", "agent_summary", "lost_retry_display", "resumed_display",
            "sandbox_until_display", "changes_display"]

    @admin.action(description="Publish again (work kept on this host after a failed publish)",
                  permissions=["publish_again"])
    def publish_again(self, request, queryset):
        for run in queryset:
            try:
                publication = kept.publish_again(run)
            except kept.NothingKept:
                self.message_user(request, f"{run.job_id}: no kept work on this host (published since, expired, "
                                           f"or kept on {run.host}: run `python manage.py publish_again "
                                           f"{run.job_id}` there).", messages.WARNING)
                continue
            level = messages.SUCCESS if publication.outcome in ("published", "commented") else messages.ERROR
            self.message_user(request, f"{run.job_id}: {publication.outcome}", level)

    def has_publish_again_permission(self, request):
        return request.user.has_perm("worker.publish_run")


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):
    """The kept agent sessions (apps/worker/sessions/): sizes and times only, never the transcript (it holds the
    conversation). Deleting one makes its target's next job start afresh."""

    list_display = ("key_display", "size", "kept", "job_id", "host", "updated_at", "expires_at")
    list_filter = ("kept",)
    search_fields = ("job_id",)
    fields = ("key", "size", "kept", "job_id", "host", "updated_at", "expires_at")
    readonly_fields = fields

    @admin.display(description="target key")
    def key_display(self, session: AgentSession) -> str:
        return session.key[:16]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(PauseWindow)
class PauseWindowAdmin(PlainHelpTextsAdmin, admin.ModelAdmin):
    form = PauseWindowForm
    list_display = ("scope", "hours", "tz", "days_display", "dates", "enabled", "note")
    list_editable = ("enabled",)
    list_filter = ("enabled", "tz")
    search_fields = ("scope", "note")
    fieldsets = (
        (None, {"fields": ("scope", "enabled", "note")}),
        ("When", {"fields": ("starts", "ends", "tz", "days", "date_from", "date_to"),
                  "description": "Jobs in scope that would start inside [from, to) wait until the window ends."}),
    )

    @admin.display(description="hours")
    def hours(self, window: PauseWindow) -> str:
        overnight = " (overnight)" if window.ends < window.starts else ""
        return f"{window.starts:%H:%M}-{window.ends:%H:%M}{overnight}"

    @admin.display(description="days")
    def days_display(self, window: PauseWindow) -> str:
        return ", ".join(DAY_NAMES.get(day, day)[:3] for day in window.days) or "every day"

    @admin.display(description="dates")
    def dates(self, window: PauseWindow) -> str:
        if not (window.date_from or window.date_to):
            return "-"
        return f"{window.date_from or '…'} to {window.date_to or '…'}"


class MembersField(forms.CharField):
    """A project's members, one a line (stored as a list)."""

    widget = forms.Textarea(attrs={"rows": 6, "cols": 60})

    def prepare_value(self, value):
        return "\n".join(value) if isinstance(value, list) else value

    def to_python(self, value):
        return [line.strip() for line in (value or "").splitlines() if line.strip()]


class ProjectForm(forms.ModelForm):
    members = MembersField(help_text="One a line: github:owner/repo (any forge's prefix) or an absolute folder. A "
                                     "repository or folder belongs to one project.",
                           error_messages={"required": Project._meta.get_field("members").error_messages["blank"]})

    class Meta:
        model = Project
        fields = ("slug", "name", "members")


@admin.register(Project)
class ProjectAdmin(ManagedChangesAdmin, admin.ModelAdmin):
    """What `import_projects` reads: runs are stamped with their project when enqueued."""

    manage_permission = "worker.manage_projects"
    form = ProjectForm
    list_display = ("slug", "name", "member_count")
    search_fields = ("slug", "name")

    @admin.display(description="members")
    def member_count(self, project: Project) -> int:
        return len(project.members)

    def get_deleted_objects(self, objs, request):
        # A project a `project:` scoped limit names is protected, as a row another row points at would be.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        protected += [f"Scoped limit: {limit.scope}" for project in objs for limit in project.limits_naming_it()]
        return deleted, counts, perms_needed, protected


@admin.register(ScopedLimit)
class ScopedLimitAdmin(PlainHelpTextsAdmin, ManagedChangesAdmin, admin.ModelAdmin):
    manage_permission = "worker.manage_limits"
    list_display = ("scope", "day", "week", "month", "concurrent", "day_dollars", "week_dollars", "month_dollars",
                    "memory", "cpus", "note")
    search_fields = ("scope", "note")
    fieldsets = (
        (None, {"fields": ("scope", "note")}),
        ("Runs (UTC day, Monday week, calendar month) and at once", {"fields": ("day", "week", "month", "concurrent")}),
        ("Dollars (each window needs the per-run cap of the dispatch settings, or PI_MAX_COST_USD)",
         {"fields": ("day_usd", "week_usd", "month_usd")}),
        ("Project rows: container size, share of a host's budget and floor of jobs",
         {"fields": ("memory", "cpus", "host_share", "min_jobs")}),
    )

    def changelist_view(self, request, extra_context=None):
        uncapped = validators.uncapped_dollar_rows()  # an imported ancestor file may hold such rows
        if uncapped:
            messages.warning(request, validators.uncapped_dollars_warning(uncapped))
        return super().changelist_view(request, extra_context)

    @admin.display(description="day $", ordering="day_usd")
    def day_dollars(self, limit: ScopedLimit) -> str:
        return admin_display.money(limit.day_usd)

    @admin.display(description="week $", ordering="week_usd")
    def week_dollars(self, limit: ScopedLimit) -> str:
        return admin_display.money(limit.week_usd)

    @admin.display(description="month $", ordering="month_usd")
    def month_dollars(self, limit: ScopedLimit) -> str:
        return admin_display.money(limit.month_usd)


SETTINGS_ROW = 1  # the settings row's pk (runtime_settings.current reads pk 1)


@admin.register(DispatchSettings)
class DispatchSettingsAdmin(PlainHelpTextsAdmin, ManagedChangesAdmin, admin.ModelAdmin):
    """The one settings row. Blank fields fall back to the environment; the page shows what applies now."""

    manage_permission = "worker.manage_settings"
    readonly_fields = ("effective_values",)
    fieldsets = (
        ("In effect now", {"fields": ("effective_values",)}),
        ("Job-count caps (UTC day, Monday week, calendar month)",
         {"fields": ("daily_cap", "weekly_cap", "monthly_cap", "soft_hold_pct")}),
        ("Per run", {"fields": ("max_turns", "max_tokens", "job_memory", "job_cpus")}),
        ("Tokens", {"fields": ("daily_token_cap",)}),
        ("Per worker host", {"fields": ("concurrency",)}),
        ("Lost workers", {"fields": ("lost_retries",)}),
        ("Dollar caps (a window needs the per-run cap)",
         {"fields": ("max_cost_usd", "daily_cost_usd", "weekly_cost_usd", "monthly_cost_usd")}),
    )

    @admin.display(description="values jobs run under")
    def effective_values(self, row: DispatchSettings) -> str:
        try:
            effective = runtime_settings.current()
        except runtime_settings.SettingsInvalid as exc:
            return format_html("<strong>Invalid: every job is refused ({}).</strong>", exc)
        return format_html_join(
            mark_safe("<br>"), "{}: {}",
            ((name.replace("_", " "), "no cap" if value is None else value)
             for name, value in vars(effective).items()),
        )

    def has_add_permission(self, request):
        return False  # the one row is changed, never added (see get_object)

    def has_delete_permission(self, request, obj=None):
        return False

    def get_object(self, request, object_id, from_field=None):
        row = super().get_object(request, object_id, from_field)
        if row is None and str(object_id) == str(SETTINGS_ROW):
            # Not saved yet: the page shows the environment's values and its first save writes the row. A GET
            # creates nothing.
            return DispatchSettings(pk=SETTINGS_ROW)
        return row

    def changelist_view(self, request, extra_context=None):
        # One row: the list would only be a detour to it, and it is always its change page.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return redirect(reverse("admin:worker_dispatchsettings_change", args=[SETTINGS_ROW]))

    def add_view(self, request, form_url="", extra_context=None):
        return self.changelist_view(request)
