"""The words the worker publishes: a pull request's title (the target's) and body, a commit's message and a
comment, from the agent's summary.

The summary is the agent's own text (forge data: it may quote the issue), bounded by the runner; it goes to
the forge and nowhere else, and only as `postable_summary` leaves it (no secret of the deployment's in it, in any
form the scrubber knows). What the worker adds is fixed text and ids.
"""

from __future__ import annotations

import re

from django.conf import settings

from apps.worker.forges.base import fit
from apps.worker.jobs import JobSpec
from apps.worker.scrubbing import Scrubber

TITLE_CHARS = 72
COMMIT_BODY_CHARS = 16_000
CUT_MARKER = "\n\n… (cut: the rest is longer than the forge allows)"
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# What stands for a withheld summary in the kept work, so that "Publish again" never posts it.
WITHHELD_SUMMARY = "The agent's summary is not shown: it held a credential of this deployment."


def _clean(text: str) -> str:
    return CONTROL.sub("", text or "").strip()


def postable_summary(summary: str, *, credentials: dict[str, str], job_secrets: dict[str, str]) -> tuple[str, bool]:
    """The summary as it may reach the forge, and whether it held one of the `credentials` (the provider key, a
    forge token; by name), or a job secret in a form that cannot be cut out. The job's own secrets (`run.secrets`:
    the trigger gave them to the agent) are scrubbed out and the rest is posted. A credential is another matter: the
    agent never holds one (the gateway adds the key outside its container, the worker publishes with the token), so
    a summary holding one, as it is, encoded or split, means the agent reached it around its sandbox, or tried to
    smuggle it out. Nothing it wrote is then trusted to be free of it in some form the scrubber does not know: the
    caller posts none of its words and pushes none of its commits (`summary-held-secret`), and keeps the work with
    WITHHELD_SUMMARY in place of the summary, for an operator to review and publish again under that fixed text."""
    if Scrubber(credentials).finds(summary):
        return WITHHELD_SUMMARY, True
    scrubbed = Scrubber({**job_secrets, **credentials}).scrub(summary)
    if Scrubber(job_secrets).finds(scrubbed):
        # A form only the forge's page shows (entities, an invisible character, a comment between its halves):
        # what cannot be cut out of the text is not posted either.
        return WITHHELD_SUMMARY, True
    return scrubbed, False


def footer(spec: JobSpec) -> str:
    line = f"Published by pidispatch for job `{spec.job_id}`."
    if settings.PI_PUBLIC_URL:
        line += f" Run record: {settings.PI_PUBLIC_URL.rstrip('/')}/admin/worker/run/?job_id={spec.job_id}"
    return line


def title(spec: JobSpec, summary: str) -> str:
    """The target's own title (`Login fails on Safari (#7)`): the forge's public text, going back to the forge and
    nowhere else. Without one (a schedule's job) the summary's first line, else the flow."""
    target = " ".join(_clean(getattr(spec, "title", "") or "").split())
    if target:
        number = f" (#{spec.number})" if spec.number is not None and spec.target_type == "issue" else ""
        room = TITLE_CHARS - len(number)
        return (target if len(target) <= room else target[:room - 1].rstrip() + "…") + number
    first = next((line.strip().lstrip("#").strip() for line in _clean(summary).splitlines() if line.strip()), "")
    if not first:
        what = spec.flow or spec.command
        first = f"pi: {what} for #{spec.number}" if spec.number is not None else f"pi: {what}"
    return first if len(first) <= TITLE_CHARS else first[:TITLE_CHARS - 1].rstrip() + "…"


def commit_message(spec: JobSpec, summary: str) -> str:
    """The message of the commit that holds what the agent left uncommitted: the title, then the agent's summary
    (its own commits keep their own messages)."""
    text = _clean(summary)
    return title(spec, summary) + ("\n\n" + fit(text, COMMIT_BODY_CHARS, CUT_MARKER) if text else "") + "\n"


def body(spec: JobSpec, summary: str, limit: int, note: str = "") -> str:
    """The agent's summary (or a fixed line when it wrote none), a note of the worker's, and the footer."""
    tail = "\n\n".join(part for part in (note, "---\n" + footer(spec)) if part)
    text = _clean(summary) or "The agent finished without a summary of its work."
    return fit(text, limit - len(tail) - 2, CUT_MARKER) + "\n\n" + tail
