"""Every reason token a run record can carry, explained once: what it means and what to do next.

One home for the words about a reason: the admin (run page, run list hover, fleet panel), the API
(`as_table()`) and the forge comments (the fixed sentences below, which `comments.py` posts) all read
this module. Fixed text only: no path, amount, reference or login (comments land in logs too).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    token: str
    means: str      # one line: what happened
    next_step: str  # one line: what the operator does about it

    def as_json(self) -> dict:
        return {"token": self.token, "means": self.means, "next": self.next_step}


_CHECK_LOG = "Read the worker log on the run's host for this job id."
_RETRIED = "Retried by itself; if every attempt fails, fix the cause and use “retry now” on the fleet panel."
_TRIGGER = "Fix the trigger (Intake › Triggers), then start the run again."

# token: (what it means, what to do next)
_EXPLAINED: dict[str, tuple[str, str]] = {
    # --- completed / published
    "published": ("The worker pushed the agent's commits and opened (or updated) a pull/merge request.",
                  "Review the pull request linked on the run."),
    "commented": ("The agent made no commits; its summary was posted as a comment.",
                  "Read the comment linked on the run."),
    "nothing-to-publish": ("The agent finished without commits or a summary: nothing reached the forge.",
                           "Check the task text and the flow; start the run again with a clearer task."),
    "branch-moved": ("The pull request's branch moved while the agent worked, so its work went in a comment instead.",
                     "Read the comment; start the run again on the new head if the work is still wanted."),
    # --- infrastructure (failed, retried)
    "runner-infra": ("The in-container runner hit an infrastructure error (its provider stream or a tool broke).",
                     _RETRIED),
    "container-exit-unknown": ("The container exited with a code the runner protocol does not define (it crashed, "
                               "or the image is not the job image).",
                               "Check the job image (`make image` on the host) and the worker log; "
                               + _RETRIED.lower()),
    "container-never-started": ("The Docker engine did not start the job's container.",
                                "Check the engine on the host (`docker info`); " + _RETRIED.lower()),
    "docker-unavailable": ("The worker could not reach its Docker engine.",
                           "Start or fix dockerd on the host (DOCKER_HOST); " + _RETRIED.lower()),
    "redis-unavailable": ("Redis did not answer while the job ran.", "Check Redis (REDIS_URL); " + _RETRIED.lower()),
    "egress-gateway-unavailable": ("The job's egress gateway could not be started on the host.",
                                   "Check PI_EGRESS_SOCKET_DIR on the host; " + _RETRIED.lower()),
    "git-unavailable": ("git could not be run on the worker host while a cron job's GitHub repository was read.",
                        "Install git on the host (Debian's git package); " + _RETRIED.lower()),
    "disk-full": ("The worker host's disk was full while the job was prepared.",
                  "Free space under PI_JOB_ROOT on the host, then retry."),
    "secret-resolver-unreachable": ("The host's secret resolver did not answer (timeout, crash or exit 1).",
                                    "Check the resolver script of PI_SECRET_PROFILES on the host, then retry."),
    "clone-failed": ("The forge did not serve the clone (5xx, network, a dropped connection).", _RETRIED),
    "clone-timeout": ("The clone took longer than PI_CLONE_TIMEOUT_SECONDS.",
                      "Raise PI_CLONE_TIMEOUT_SECONDS for a large repository; " + _RETRIED.lower()),
    "forge-unavailable": ("The forge answered with a server error while the job was prepared.", _RETRIED),
    "forge-unreachable": ("The forge could not be reached while the job was prepared.", _RETRIED),
    "forge-rate-limited": ("The forge rate-limited this deployment's credential.", _RETRIED),
    "forge-malformed-answer": ("The forge sent an answer the worker could not read.", _CHECK_LOG),
    "pull-request-conflict": ("The pull request changed while the worker read it.", _RETRIED),
    "worker-lost": ("The worker process running the job died (killed, host rebooted, or Redis gone too long).",
                    "Check the host's supervisor and memory. The job runs again by itself as its next attempt "
                    "unless its runs after a lost worker (PI_LOST_RETRIES) are used up or off: the run says "
                    "which; start it again if it is still wanted."),
    "worker-error": ("A bug in pidispatch's own code stopped the job; its traceback is in the worker log.",
                     _CHECK_LOG + " Report it with the traceback."),
    "publish-unavailable": ("The agent finished but the forge did not answer the publish step, on every try.",
                            "Use “Publish again” on the run (the work is kept on the host for PI_KEEP_WORK_HOURS)."),
    # --- stopped after spend (policy)
    "operator-cancel": ("An operator cancelled the job (fleet panel or `fleet cancel`).", "Nothing to do."),
    "worker-abort": ("The worker stopped the container: the job hit PI_JOB_TIMEOUT_SECONDS, or the worker shut down.",
                     "Raise PI_JOB_TIMEOUT_SECONDS, or split the task; start it again."),
    "runner-policy": ("The run ended inside the container before finishing, for a reason the runner did not name.",
                      _CHECK_LOG),
    "oom-killed": ("The container ran out of memory.", "Raise the job memory (Settings or PI_JOB_MEMORY)."),
    "job-size-exceeds-host": ("The job's size (memory or CPUs) is larger than this host's whole budget: it could "
                              "never start here.",
                              "Lower the job's size (its project row's memory/cpus, or PI_JOB_MEMORY/PI_JOB_CPUS) or "
                              "raise PI_HOST_MEMORY_BUDGET/PI_HOST_CPU_BUDGET on the host."),
    "job-size-exceeds-share": ("The job's size is larger than its project's share of this host's budget "
                               "(hostShare): it could never start here.",
                               "Raise the project row's hostShare or lower its memory/cpus (Limits)."),
    "job-size-exceeds-fleet": ("No live host's budget can hold the job's size: it could never start anywhere.",
                               "Lower the job's size, or give a host a budget that holds it."),
    "provider-auth-refused": ("The model provider refused the deployment's key.",
                              "Fix the provider key on the worker hosts (e.g. ANTHROPIC_API_KEY)."),
    "cost-cap": ("The run reached its per-run dollar cap: its next provider call's worst case (its input and "
                 "the least useful answer, at the model's price) no longer fit, so the gateway stopped the run.",
                 "Raise PI_MAX_COST_USD (Settings) or the trigger's maxCostUsd, or give a smaller task."),
    "model-not-allowed": ("The run's model is not on its allowed-model list (the trigger's run.models, else "
                          "PI_ALLOWED_MODELS; or the one PI_MODEL allows), or the list names no model of the run's "
                          "provider: refused before the run, or its call refused by the gateway and the run stopped.",
                          "Add the model to the list, or pick a listed model in the trigger (or PI_MODEL)."),
    "cost-cap-unenforceable": ("The job image cannot enforce the cost limit.", "Rebuild the job image (`make image`)."),
    "model-policy-unenforceable": ("The job image cannot enforce the model policy.",
                                   "Rebuild the job image (`make image`)."),
    "turn-budget": ("The agent used all its turns.",
                    "Raise max turns on the trigger or in Settings, or narrow the task."),
    "token-budget": ("The run used all its tokens (PI_MAX_TOKENS).",
                     "Raise max tokens in Settings, or narrow the task."),
    "command-unregistered": ("The job image does not know the command the trigger names.",
                             "Fix the trigger's command, or add the extension to the image."),
    "runner-config": ("The job image refused its configuration.",
                      "Rebuild the job image (`make image`); " + _CHECK_LOG.lower()),
    "egress-denied": ("The job tried to reach a host PI_EGRESS_ALLOW does not list, or made a provider call the "
                      "gateway does not forward (a path other than the model's own calls, a provider-side tool, "
                      "stored content), and then failed.",
                      "Add that host:port to PI_EGRESS_ALLOW if the job needs it; provider calls other than "
                      "inference are never forwarded. The worker log's egress lines say which."),
    "model-unpriced": ("The run asked for a model with no known price while a dollar cap applies, so its cost "
                       "could not be bounded; the gateway refused the call and stopped the run.",
                       "Price the model in PI_MODEL_PRICES, or run it without a dollar cap."),
    "request-malformed": ("The job sent its provider a request the gateway does not read as one JSON object "
                          "(duplicate keys, invalid UTF-8, NaN): it was not forwarded and the run was stopped.",
                          "Nothing the real pi sends does this: treat the run as a prompt-injection attempt and "
                          "read the issue's text."),
    "usage-unreadable": ("The provider answered a call without saying what it used; the call was charged its "
                         "reserved worst case and the run stopped.",
                         "Check the provider (PI_PROVIDER_BASE_URL) reports usage in its API's shape."),
    "daily-token-cap": ("The deployment's tokens for today (PI_DAILY_TOKEN_CAP) are used up.",
                        "Wait for the UTC day to end, or raise the cap in Settings."),
    # --- refused before spend (policy)
    "settings-overlay-invalid": ("The settings row is invalid, so every job is refused.",
                                 "Fix Settings (Runs › Dispatch settings)."),
    "once-already-spent": ("This one-shot trigger already ran.", "Re-arm the trigger if it should fire again."),
    "job-image-missing": ("The job image is not installed on the host.",
                          "Run `make image` on the host (PI_JOB_IMAGE)."),
    "job-image-unlabelled": ("The job image carries no runner labels.", "Rebuild it with `make image`."),
    "job-image-protocol-mismatch": ("The job image speaks another runner protocol than this worker.",
                                    "Rebuild it with `make image` from this version."),
    "job-payload-invalid": ("This worker could not read the job (producer and worker run different versions).",
                            "Deploy one version everywhere, then start the run again."),
    "pull-request-closed": ("The pull request was closed before the job started.", "Nothing to do."),
    "pull-request-missing": ("The pull request does not exist (any more).", "Check the target's number."),
    "provider-unconfigured": ("The worker has no key (or no endpoint) for the job's provider.",
                              "Set the provider's key on the worker hosts, or fix the trigger's provider."),
    "forge-unconfigured": ("This deployment has no credential for the job's forge.", "Set the forge's token (README)."),
    "forge-auth-refused": ("The forge refused the deployment's credential for this repository.",
                           "Renew the token, or grant it this repository."),
    "forge-repo-not-found": ("The credential cannot see this repository.",
                             "Grant the token (or the App) the repository."),
    "forge-request-refused": ("The forge refused a request the worker needed.", _CHECK_LOG),
    "forge-redirect-refused": ("The forge answered with a redirect (a moved or renamed repository?).",
                               "Update the trigger or the webhook to the new name."),
    "forge-clone-url-refused": ("The forge named a clone address outside its own host.",
                                "Check the forge's URL setting."),
    "forge-listing-too-large": ("The forge's answer was larger than the worker reads.", _CHECK_LOG),
    "default-branch-missing": ("The repository has no default branch with a commit.", "Push a first commit."),
    "unprotected-branch": ("The default branch is not protected.", "Protect it on the forge (see SECURITY.md)."),
    "sha-gone": ("The default branch moved while the job was prepared.", "Start the run again."),
    "pi-too-deep": ("The repository's .pi/ folder nests too deep.", "Flatten .pi/ in the repository."),
    "pi-file-too-large": ("A file in .pi/ is too large for a job.", "Shrink the file in .pi/."),
    "pi-too-many-files": ("The .pi/ folder has too many files.", "Trim .pi/ in the repository."),
    "pi-too-large": ("The .pi/ folder is too large.", "Trim .pi/ in the repository."),
    "pi-unreadable": ("The .pi/ folder could not be read at the cloned commit.", _CHECK_LOG),
    "pi-path-refused": ("A path in .pi/ is not allowed (a link out, or an odd name).", "Fix the path in .pi/."),
    "skills-dir-missing": ("The trigger's skills folder (run.skillsDir) is not a folder on this host.",
                           "Create it on the host, or fix run.skillsDir."),
    "skills-dir-too-deep": ("The trigger's skills folder nests too deep.", "Flatten the skills folder."),
    "skills-dir-file-too-large": ("A file in the trigger's skills folder is too large for a job.", "Shrink it."),
    "skills-dir-too-many-files": ("The trigger's skills folder has too many files.", "Trim the skills folder."),
    "skills-dir-too-large": ("The trigger's skills folder is too large.", "Trim the skills folder."),
    "skills-dir-not-allowed": ("The trigger's skills folder is not one this host copies into jobs: it is not under a "
                               "root the host declares (PI_SKILLS_ROOTS), it is or holds pidispatch's own files, or "
                               "it changed while it was read.",
                               "Read the worker log on the run's host; move the skills under a declared root, or "
                               "declare one in the host's environment."),
    "fork-unavailable": ("The trigger publishes through the deployment's fork (run.publishTo: fork), and this forge "
                         "or its credentials cannot fork here (GitHub: a token's own account, or a GitHub App's "
                         "installation on GITHUB_FORK_ORGANIZATION; GitLab; Forgejo; Azure DevOps into "
                         "AZURE_FORK_PROJECT).",
                         "Configure credentials that can fork (a GitHub App: GITHUB_FORK_ORGANIZATION; Azure DevOps: "
                         "AZURE_FORK_PROJECT), or publish to the "
                         "origin (run.publishTo: origin) knowing its CI runs the agent's code with the repository's "
                         "secrets."),
    "fork-not-ready": ("The forge had not made the deployment's fork in time.", "Nothing to do: the job is retried."),
    "chain-pi-changed": ("A chained job's .pi/ is not the one its chain's first job started on: an agent of the "
                         "chain changed the skills (or which flows may be chained) of the jobs after it.",
                         "Look at the parent's work; start the follow-up yourself if its skills are right."),
    "skills-dir-unreadable": ("A file or folder in the trigger's skills folder is not readable by every user of the "
                              "host; the worker copies only what any user may read.",
                              "Make it readable (files o+r, folders o+rx), or take it out of the skills folder."),
    "backend-unblessed": ("The job asks for a venue (run.backend) this host does not bless in PI_BACKENDS.",
                          "Bless it in the host's environment, or change the trigger's run.backend."),
    "backend-unavailable": ("The job's venue is blessed but this worker cannot run jobs on it (podman is not "
                            "implemented yet).", "Use run.backend local (or leave it empty)."),
    "github-remote-missing": ("The cron job's folder (run.github) has no GitHub repository as its origin.",
                              "Set the folder's origin to its GitHub repository, or turn run.github off."),
    "github-remote-mismatch": ("The folder's origin is not the repository of that name on this deployment's GitHub.",
                               "Point the origin at this deployment's GitHub (GITHUB_API_URL), or fix the folder."),
    "github-start-unpublished": ("The folder's HEAD is not on its GitHub default branch, so publishing would push "
                                 "commits nobody published.", "Push or drop the folder's own commits, then run again."),
    "folder-not-allowed": ("The host runs no job in this folder: it is not under a root the host declares "
                           "(PI_LOCAL_ROOTS), or it is or holds pidispatch's own files.",
                           "Read the worker log on the run's host; move the repository under a declared root, or "
                           "declare one in the host's environment."),
    "workspace-missing": ("The job's folder does not exist on the host.",
                          "Check the folder of the trigger or the run."),
    "workspace-not-a-repo": ("The job's folder is not a git repository.", "`git init` it, or fix the folder."),
    "workspace-no-commit": ("The folder's repository has no commit yet.", "Make a first commit."),
    "workspace-dirty": ("The folder has uncommitted changes.", "Commit or stash them, or start the run forced."),
    "workspace-config-unsafe": ("The folder's git config runs programs (hooks, filters) a job may not.",
                                "Remove them from the repository's .git/config."),
    "workspace-too-large": ("The workspace is larger than PI_JOB_DISK_MB.",
                            "Raise PI_JOB_DISK_MB, or clean the folder."),
    "job-user-unmappable": ("The folder belongs to root, and jobs never run as root.", "chown the folder to a user."),
    "wait-refused": ("A wait check answered that the job should never run.", "Nothing to do, or fix the check script."),
    "wait-expired": ("The job waited as long as it may (PI_WAIT_MAX_SECONDS or checks).",
                     "Check the wait profile's script; start the run again."),
    "wait-unanswerable": ("A wait check kept failing to answer.", "Fix the wait profile's script on the host."),
    "wait-profile-unknown": ("The job waits on a profile this host does not declare.", "Add it to PI_WAIT_PROFILES."),
    "wait-unreadable": ("The job's wait conditions could not be read.", _TRIGGER),
    "wait-after-beyond-max": ("The job's `after` time is further than PI_WAIT_MAX_SECONDS.", _TRIGGER),
    "wait-superseded": ("Another delivery for this target already waits on the same conditions.", "Nothing to do."),
    "secret-name-reserved": ("The trigger sets an environment variable the worker sets itself.", _TRIGGER),
    "secret-profile-unknown": ("The trigger names a resolver profile this host does not offer.",
                               "Add it to PI_SECRET_PROFILES on the host, or fix the trigger."),
    "secret-profile-ambiguous": ("The host offers several resolver profiles and the trigger names none.", _TRIGGER),
    "secret-unresolved": ("The resolver does not know a reference the trigger asks for.", _TRIGGER),
    "scope-cap": ("Over the run cap of this repository or folder (scoped limit).",
                  "Wait for the window to end, or raise the scoped limit."),
    "project-cap": ("Over the run cap of this job's project (its `project:` scoped limit).",
                    "Wait for the window to end, or raise the project's limit."),
    "dollar-cap": ("A dollar window (day, week or month; the deployment's or a repository's) had no room left for "
                   "this run's per-run cap.",
                   "Wait for the window to roll over, or raise its dollar cap (Settings or the scoped limit); the "
                   "cost page shows what is used and held."),
    "cost-cap-unset": ("A scoped limit has a dollar cap but no per-run cap applies, so the run's cost could not be "
                       "held.",
                       "Set PI_MAX_COST_USD (Settings) so every run holds its cap before it starts."),
    "over-budget": ("Over the deployment's job-count cap (day, week or month).",
                    "Wait for the window to end, or raise the cap in Settings."),
    "soft-hold": ("Inside the cap's hold band: new starts wait for the next window.", "Lower soft hold % in Settings."),
    # --- publish refusals (policy)
    "ci-change-refused": ("The agent's change touches CI definitions, which the trigger may not change.",
                          "Review the kept work; set “allow CI changes” on the trigger and “Publish again”."),
    "push-too-many-files": ("The change touches more files than PI_MAX_CHANGED_FILES.",
                            "Raise it and “Publish again”."),
    "push-too-large": ("The change is larger than PI_MAX_PUSH_BYTES.", "Raise it and “Publish again”."),
    "file-too-large": ("A changed file is larger than the forge accepts.", "Nothing to push; narrow the task."),
    "symlink-escapes": ("The change adds a link out of the repository (directly, or through the repository's "
                        "other links).", "Not publishable; narrow the task."),
    "submodule-change-refused": ("The change touches a submodule.", "Not publishable; narrow the task."),
    "workspace-repo-unsafe": ("The agent left its repository in a state the worker does not read.", _CHECK_LOG),
    "work-unreadable": ("The worker could not read the agent's work.", _CHECK_LOG),
    "work-too-large": ("The agent's git history is more than publishing takes: more commits than "
                       "PI_PUBLISH_MAX_COMMITS, a commit whose files grow the repository by more than "
                       "PI_MAX_CHANGED_FILES paths or PI_MAX_PUSH_BYTES bytes (counted from git's object headers, "
                       "before anything is expanded), or reading it took longer than PI_PUBLISH_TIMEOUT_SECONDS. The "
                       "run page names the bound.",
                       "Nothing is published; start the run again with a narrower task, or raise the bound."),
    "work-config-unsafe": ("The agent's .git/config could make the worker's git run a program or reach elsewhere "
                           "(partial clone, a promisor or added remote, a protocol, a URL rewrite, fsmonitor, ...).",
                           "Nothing is read or published; start the run again, and tell the task not to change git's "
                           "configuration."),
    "work-nested-repository": ("The agent left another git repository (a .git folder, or a .git file naming one) "
                               "inside its workspace, which the worker does not follow.",
                               "Nothing is published; start the run again without nested repositories."),
    "push-refused": ("The forge refused the push (a protected branch, or a hook).",
                     "Allow the bot to push pi/* branches, then “Publish again”."),
    "summary-held-secret": ("The agent's summary held the provider key or a forge token (as it is, encoded, or in "
                            "a form only the forge's page shows), or one of the job's secrets in a form that cannot "
                            "be cut out, so nothing of the run was published.",
                            "Treat the key or token as leaked: rotate it, and review the kept work before "
                            "“Publish again” (which posts a fixed text, never that summary)."),
    "secret-in-work": ("A file or a commit message of the agent's work held a secret of this deployment or of the "
                       "job (as it is, encoded, or in a form the forge's page shows as it): the run page says which "
                       "file or commit and which secret, by its name. Nothing was pushed.",
                       "Treat that secret as leaked (rotate it), and look at the kept work; it is not published "
                       "as it is."),
}

REASONS: dict[str, Reason] = {token: Reason(token, *text) for token, text in _EXPLAINED.items()}


def explain(token: str) -> Reason | None:
    """The table's entry for a reason (or publish outcome) token; None for an empty or unknown one."""
    return REASONS.get(token or "")


def as_table() -> list[dict]:
    """The whole table, for the API (`GET /api/v1/reasons` would serve this)."""
    return [reason.as_json() for reason in REASONS.values()]


# --- what became of an attempt whose worker died (Run.lost_retry; apps/worker/process/worker_lost.py) ----------

LOST_RETRY = {
    "retried": "lost; retried as attempt {next}",
    "used-up": "lost; not retried: its runs after a lost worker are used up (PI_LOST_RETRIES)",
    "off": "lost; not retried: runs after a lost worker are off (PI_LOST_RETRIES is 0)",
    "cancelled": "lost; not retried: an operator cancelled it",
}


def lost_retry_text(decision: str, attempt: int) -> str:
    """A lost attempt's words (`lost; retried as attempt 2`, or why it was not run again); "" for any other."""
    text = LOST_RETRY.get(decision or "")
    return text.format(next=attempt + 1) if text else ""


# --- the fixed sentences the worker posts on the issue or pull request (comments.py) -------------------------

# Failed outcomes that are final at any attempt.
NOT_RETRIED_FAILURES = {"worker-lost", "worker-error", "publish-unavailable"}

REFUSED = {
    "operator-cancel": "Stopped: the operator cancelled this run before it started. Nothing was spent. Not retried.",
    "settings-overlay-invalid": "Refused: this deployment's settings are invalid, so no job can start. Not run.",
    "once-already-spent": "Refused: this one-time trigger has already run once. Not run.",
    "job-size-exceeds-host": "Refused: this job needs more than the worker can ever give it. Not run.",
    "job-size-exceeds-share": "Refused: this job needs more than the worker can ever give it. Not run.",
    "job-size-exceeds-fleet": "Refused: this job needs more than any worker can ever give it. Not run.",
    "job-image-missing": "Refused: the job image is not installed on the worker. Not run.",
    "job-image-unlabelled": "Refused: the job image was not built for this worker (it carries no runner labels). "
                            "Not run.",
    "job-image-protocol-mismatch": "Refused: the job image speaks another runner protocol than this worker. "
                                   "Not run.",
    "pull-request-closed": "Refused: the pull request is closed. Not run.",
    "pull-request-missing": "Refused: the forge no longer knows this pull request. Not run.",
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
    "skills-dir-missing": "Refused: the trigger's skills folder is not on the worker. Not run.",
    "skills-dir-too-deep": "Refused: the trigger's skills folder nests deeper than a job may carry. Not run.",
    "skills-dir-file-too-large": "Refused: a file in the trigger's skills folder is larger than a job may carry. "
                                 "Not run.",
    "skills-dir-too-many-files": "Refused: the trigger's skills folder has more files than a job may carry. Not run.",
    "skills-dir-too-large": "Refused: the trigger's skills folder is larger than a job may carry. Not run.",
    "skills-dir-not-allowed": "Refused: the trigger's skills folder is not one the worker copies into jobs. Not run.",
    "skills-dir-unreadable": "Refused: the trigger's skills folder holds what not every user of the worker may read. "
                             "Not run.",
    "fork-unavailable": "Refused: this trigger publishes through the deployment's fork, and this forge cannot fork "
                        "here. Not run.",
    "chain-pi-changed": "Refused: an earlier job of this chain changed the repository's .pi/ (its skills), so this "
                        "follow-up was not run.",
    "backend-unblessed": "Refused: the worker does not run jobs on the venue this trigger asks for. Not run.",
    "backend-unavailable": "Refused: the venue this trigger asks for is not available on the worker. Not run.",
    "folder-not-allowed": "Refused: the worker does not run jobs in this folder. Not run.",
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
    "project-cap": "Refused: over the run cap for this project. Not run.",
    "over-budget": "Refused: over the deployment's budget cap. Not run.",
    "soft-hold": "Refused: new starts are paused while spend is inside the budget's hold band. Not run.",
    # Never an amount: a window's cap and spend are the operator's.
    "dollar-cap": "Refused: the dollar budget has no room for this run's cost limit. Not run.",
    "model-unpriced": "Refused: this run's model has no known price, and a cost limit applies. Not run.",
    "model-not-allowed": "Refused: this run's model is not on the models this deployment allows for it. Not run.",
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
    "model-unpriced": "Stopped: the run asked for a model whose price this deployment does not know, under a "
                      "cost limit. Not retried.",
    "request-malformed": "Stopped: the run sent its model provider a malformed request. Not retried.",
    "usage-unreadable": "Stopped: the model provider did not report what a call used. Not retried.",
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
    "work-too-large": NOT_PUBLISHED + "the agent's git history is more than this deployment publishes.",
    "work-config-unsafe": NOT_PUBLISHED + "the agent changed the repository's git configuration in a way the worker "
                          "does not read.",
    "work-nested-repository": NOT_PUBLISHED + "the agent left another git repository inside its workspace.",
    "push-refused": NOT_PUBLISHED + "the forge refused the push (a protected branch, or a hook)." + KEPT,
    "summary-held-secret": NOT_PUBLISHED + "the agent's summary held a credential of this deployment." + KEPT,
    "secret-in-work": NOT_PUBLISHED + "the agent's work held a credential of this deployment or of the job." + KEPT,
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
