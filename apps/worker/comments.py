"""What the worker tells the issue or pull request: one fixed sentence per refusal and per terminal stop.

Where it hooks in: `on_run_recorded`, a receiver of `apps.worker.records.run_recorded` (connected in
`WorkerConfig.ready`). Every run record, whoever writes it (the job's work horse, or the worker that
settles a lost job), passes through there once per attempt, after the record is safely written:

- a policy outcome (a pre-spend refusal "Refused: ... Not run.", or a stop after spend "Stopped: ...")
  posts its sentence;
- a failed attempt that will be retried posts nothing; the final failed attempt posts once;
- a completed run posts nothing here: its publish step (apps/worker/publishing/) opened a pull request or
  commented with the agent's own summary; a publish refusal is a policy outcome and posts its sentence.

The sentences are fixed text: never a host path, an amount, a secret reference or a login (they also
land in logs). A local job has no forge: its sentence is logged instead. Posting never fails the job; a
failure is logged with its reason token only.
"""

from __future__ import annotations

import logging

from django.conf import settings

from .forge_workspace import repo_ref
from .forges import ForgeFailure, forge_client
from .jobs import FORGE_KINDS, JobSpec
from .models import Outcome, Run

logger = logging.getLogger("pidispatch.comments")

# Failed outcomes that are final at any attempt.
NOT_RETRIED_FAILURES = {"worker-lost", "worker-error", "publish-unavailable"}

REFUSED = {
    "operator-cancel": "Stopped: the operator cancelled this run before it started. Nothing was spent. Not retried.",
    "settings-overlay-invalid": "Refused: this deployment's settings are invalid, so no job can start. Not run.",
    "once-already-spent": "Refused: this one-time trigger has already run once. Not run.",
    "job-image-missing": "Refused: the job image is not installed on the worker. Not run.",
    "job-image-unlabelled": "Refused: the job image was not built for this worker (it carries no runner labels). "
                            "Not run.",
    "job-image-protocol-mismatch": "Refused: the job image speaks another runner protocol than this worker. "
                                   "Not run.",
    "pull-request-closed": "Refused: the pull request is closed. Not run.",
    "provider-unconfigured": "Refused: the worker has no credential for the model provider. Not run.",
    "forge-unconfigured": "Refused: this deployment has no usable credential for this forge. Not run.",
    "forge-auth-refused": "Refused: the forge refused this deployment's credential for this repository. Not run.",
    "forge-repo-not-found": "Refused: this deployment's credential cannot see this repository. Not run.",
    "forge-request-refused": "Refused: the forge refused a request needed to prepare this job. Not run.",
    "forge-redirect-refused": "Refused: the forge answered with a redirect (a moved repository?). Not run.",
    "forge-clone-url-refused": "Refused: the forge named a clone address outside its own host. Not run.",
    "default-branch-missing": "Refused: the repository has no default branch with a commit to work on. Not run.",
    "unprotected-branch": "Refused: the default branch is not protected. See SECURITY.md.",
    "sha-gone": "Refused: the default branch changed while this job was being prepared. Not run.",
    "pi-too-deep": "Refused: the repository's .pi/ folder nests deeper than a job may carry. Not run.",
    "pi-file-too-large": "Refused: a file in the repository's .pi/ folder is larger than a job may carry. Not run.",
    "pi-too-many-files": "Refused: the repository's .pi/ folder has more files than a job may carry. Not run.",
    "pi-too-large": "Refused: the repository's .pi/ folder is larger than a job may carry. Not run.",
    "pi-unreadable": "Refused: the repository's .pi/ folder could not be read at the cloned commit. Not run.",
    "workspace-missing": "Refused: the job's folder does not exist on the worker. Not run.",
    "workspace-not-a-repo": "Refused: the job's folder is not a usable git repository. Not run.",
    "workspace-no-commit": "Refused: the job's repository has no commit yet. Not run.",
    "workspace-dirty": "Refused: the job's folder has uncommitted changes. Commit or stash them, or force. Not run.",
    "job-user-unmappable": "Refused: the job's folder belongs to root, and jobs never run as root. Not run.",
    "wait-refused": "Refused: a wait condition answered that this job should never run. Not run.",
    "wait-expired": "Refused: the job waited on its conditions for as long as it may. Not run.",
    "wait-unanswerable": "Refused: a wait condition kept failing to give an answer. Not run.",
    "wait-profile-unknown": "Refused: the job waits on a check this worker does not know. Not run.",
    "wait-unreadable": "Refused: the job's wait conditions could not be read by this worker. Not run.",
    "wait-after-beyond-max": "Refused: the job's start time is further away than a job may wait. Not run.",
    "wait-superseded": "Refused: another delivery for this target already waited on the same conditions. Not run.",
    # Never a name, a reference, a resolver path or a value: the operator finds those in the trigger.
    "secret-name-reserved": "Refused: the trigger asks to set an environment variable the worker sets itself. "
                            "Rename it in the trigger. Not run.",
    "secret-profile-unknown": "Refused: the trigger names a resolver profile this worker does not offer. Not run.",
    "secret-profile-ambiguous": "Refused: this worker offers several resolver profiles and the trigger names none. "
                                "Name one in the trigger. Not run.",
    "secret-unresolved": "Refused: the worker's resolver does not know a reference the trigger asks for. "
                         "Check the trigger's references. Not run.",
    "daily-token-cap": "Refused: the deployment's daily token budget is used up. Not run.",
    "scope-cap": "Refused: over the run cap for this repository. Not run.",
    "over-budget": "Refused: over the deployment's budget cap. Not run.",
    "soft-hold": "Refused: new starts are paused while spend is inside the budget's hold band. Not run.",
    # Never an amount: a window's cap and spend are the operator's.
    "dollar-cap": "Refused: the dollar budget has no room for this run's cost limit. Not run.",
    "cost-cap-unset": "Refused: this repository has a dollar budget but no cost limit per run is set. Ask the "
                      "operator to set one. Not run.",
    "job-payload-invalid": "Refused: this worker could not read the job (a version mismatch). Not run.",
    "workspace-too-large": "Refused: the repository takes more disk than this deployment lets a job use. Not run.",
}

NOT_PUBLISHED = "Stopped: nothing was published: "
KEPT = " The work is kept on the worker for the operator."
STOPPED = {
    "operator-cancel": "Stopped: the operator cancelled this run. Partial work may exist. Not retried.",
    "worker-abort": "Stopped: the worker ended this run before it finished (the 30-minute job limit, or a worker "
                    "shutdown). Partial work may exist. Not retried.",
    "runner-policy": "Stopped: the run ended inside the container before finishing (a turn or token budget, or an "
                     "in-container configuration refusal). Partial work may exist. Not retried.",
    "oom-killed": "Stopped: the run ran out of memory inside the container. Partial work may exist. Not retried.",
    "provider-auth-refused": "Stopped: the model provider refused the deployment's credential. Not retried.",
    "cost-cap": "Stopped: the run reached its cost limit. Partial work may exist. Not retried.",
    "model-not-allowed": "Stopped: the run asked for a model this deployment does not allow. Not retried.",
    "cost-cap-unenforceable": "Stopped: the job image cannot enforce this deployment's cost limit. Not retried.",
    "model-policy-unenforceable": "Stopped: the job image cannot enforce this deployment's model policy. "
                                  "Not retried.",
    "turn-budget": "Stopped: the run used its whole turn budget. Partial work may exist. Not retried.",
    "token-budget": "Stopped: the run used its whole token budget. Partial work may exist. Not retried.",
    "command-unregistered": "Stopped: the job image does not know the requested command. Not retried.",
    "daily-token-cap": "Stopped: the deployment's daily token budget ran out during the run. Partial work may "
                       "exist. Not retried.",
    "egress-denied": "Stopped: the run failed after the job's network gateway refused a connection it is not "
                     "allowed to make. Not retried.",
    # The publish step's refusals: the agent finished, the worker did not push.
    "ci-change-refused": NOT_PUBLISHED + "the change touches CI definitions, which this trigger may not change."
                         + KEPT,
    "push-too-many-files": NOT_PUBLISHED + "the change touches more files than this deployment pushes." + KEPT,
    "push-too-large": NOT_PUBLISHED + "the change is larger than this deployment pushes." + KEPT,
    "file-too-large": NOT_PUBLISHED + "a file is larger than the forge accepts." + KEPT,
    "symlink-escapes": NOT_PUBLISHED + "the change adds a link that points outside the repository." + KEPT,
    "submodule-change-refused": NOT_PUBLISHED + "the change adds, changes or removes a submodule." + KEPT,
    "workspace-repo-unsafe": NOT_PUBLISHED + "the agent left its repository in a state the worker does not read.",
    "work-unreadable": NOT_PUBLISHED + "the worker could not read the agent's work.",
    "push-refused": NOT_PUBLISHED + "the forge refused the push (a protected branch, or a hook)." + KEPT,
    "forge-auth-refused": NOT_PUBLISHED + "the forge refused this deployment's credential." + KEPT,
    "forge-repo-not-found": NOT_PUBLISHED + "this deployment's credential cannot see this repository." + KEPT,
    "forge-request-refused": NOT_PUBLISHED + "the forge refused a request to open the pull request." + KEPT,
    "runner-config": "Stopped: the job image refused its configuration. Not retried.",
    "workspace-too-large": "Stopped: the run's workspace outgrew the disk this deployment lets a job use. "
                           "Partial work may exist. Not retried.",
}

FAILED = {
    "worker-lost": "Failed: the worker running this job stopped unexpectedly. Partial work may exist. Not retried.",
    "secret-resolver-unreachable": "Failed: the worker's resolver did not answer, on every attempt. Nothing was "
                                   "spent. Ask the operator to check the resolver on the worker host.",
    "publish-unavailable": "Failed: the forge did not answer the publish step, on every try. The agent's work "
                           "is kept on the worker; the operator can publish it again. Not re-run.",
    "disk-full": "Failed: the worker host's disk was full while the job was prepared, on every attempt. Nothing "
                 "was spent. Ask the operator to free space on the worker host.",
}
FAILED_DEFAULT = ("Failed: an error stopped this job and it will not be retried further. "
                  "Ask the operator to check the worker log.")


def is_final(run: Run) -> bool:
    """Will this attempt be the job's last? Only failed attempts can be followed by another."""
    if run.outcome != Outcome.FAILED:
        return True
    return run.attempt >= settings.PI_RETRY_ATTEMPTS or run.reason in NOT_RETRIED_FAILURES


def sentence_for(run: Run) -> str | None:
    """The one sentence this run record stands for on the forge, or None when it says nothing."""
    if run.outcome == Outcome.COMPLETED or not is_final(run):
        return None
    if run.outcome == Outcome.FAILED:
        return FAILED.get(run.reason, FAILED_DEFAULT)
    if run.exit_code is None:  # refused before any container ran
        return REFUSED.get(run.reason) or f"Refused: this job was refused before it started ({run.reason}). Not run."
    return STOPPED.get(run.reason) or f"Stopped: the run ended as {run.reason}. Partial work may exist. Not retried."


def post(spec: JobSpec, reason: str, text: str) -> bool:
    """Post `text` on the job's issue or pull request (a local job: log it). Never raises."""
    if spec.kind not in FORGE_KINDS:
        logger.info("comment job=%s reason=%s text=%r", spec.job_id, reason or "-", text)
        return True
    if spec.number is None:
        logger.info("comment_skipped job=%s reason=%s why=no-target", spec.job_id, reason or "-")
        return False
    try:
        forge_client(spec.kind).post_comment(repo_ref(spec), spec.target_type, spec.number, text)
    except ForgeFailure as failure:
        logger.warning("comment_failed job=%s reason=%s why=%s", spec.job_id, reason or "-", failure.reason)
        return False
    except Exception as error:  # a comment must never fail the job, whatever went wrong
        logger.warning("comment_failed job=%s reason=%s why=%s", spec.job_id, reason or "-", type(error).__name__)
        return False
    logger.info("comment_posted job=%s reason=%s", spec.job_id, reason or "-")
    return True


def on_run_recorded(sender, run: Run, spec: JobSpec, **kwargs) -> None:
    """`apps.worker.records.run_recorded` receiver: the one place status comments are posted from."""
    text = sentence_for(run)
    if text is not None:
        post(spec, run.reason, text)
