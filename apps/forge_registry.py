"""The forges this deployment can serve, in one table. Whatever differs by forge only in its name (the hook's
URL, the job-id prefix, the hook module that verifies and reads a delivery, the API client, the words its
events use, its settings' names, its web pages) is read from here, never spelled out again.

    forge_registry.NAMES                        ("github", "gitlab", "forgejo", "azure")
    forge_registry.get("gitlab").job_prefix     "gl"
    forge_registry.hook("gitlab")               apps.receiver.hooks.gitlab (verify, normalise)
    forge_registry.client_class("gitlab")       apps.worker.forges.gitlab.GitLabClient (from_settings)
    forge_registry.config("gitlab")             the receiver's configuration of it, or None when it is not served
    forge_registry.web_root("github")           "https://github.com" (GITHUB_WEB_URL, else from GITHUB_API_URL)
    forge_registry.target_url("gitlab", "g/p!3")  "https://gitlab.com/g/p/-/merge_requests/3"
    forge_registry.pull_url("github", "acme/web", 41)  "https://github.com/acme/web/pull/41"

A fifth forge is one entry here, its hook module (apps/receiver/hooks/), its client (apps/worker/forges/), its
configuration reader and their tests. A forge that lives outside this repository is `register`ed from the
settings module, before the apps load (every table of forges elsewhere is built from this one at import).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class Forge:
    name: str                   # in URLs (/hooks/<name>), run kinds, settings, logs
    label: str                  # for people
    job_prefix: str             # a delivery's job id is <prefix>-<delivery id>
    hook_module: str            # verify(request, config) and normalise(event, delivery_id, payload)
    client_class: str           # a ForgeClient with from_settings(timeout=, cache_seconds=)
    pr_actions: tuple[str, ...]  # the pull request actions a trigger's `on.actions` may name
    # () -> its configuration for the receiver (None: not served); raises ForgeConfigError when incomplete.
    config_reader: str
    # Its settings by name: the webhook's secret, the token jobs act with, the API's URL, and its web pages' root
    # (set for a host whose pages are not where its API is; unset, derived from the API's URL).
    secret_setting: str
    token_setting: str
    api_url_setting: str
    web_url_setting: str
    # Its web pages under the web root: {repo} as the run's target names it, {owner} and {name} its halves.
    issue_page: str = "{repo}/issues/{number}"
    pull_page: str = "{repo}/pull/{number}"
    close_word: str = ""        # the action that closes an issue ("" : no close triggers)
    pr_label_action: str = ""   # the pull request action that means "a label was applied" ("": none)
    separate_pr_numbering: bool = False  # pull requests count apart from issues, written `!n`
    # Whether an API lookup of the actor's access is needed before a match starts work (GitHub's `labeled`
    # is approval in itself), and the inbox reason when that lookup cannot be answered.
    api_gated: bool = True
    lookup_pending_reason: str = "permission-lookup-failed"

    @property
    def settings_prefix(self) -> str:
        """What every one of its settings' names starts with (a change to one forgets its configuration)."""
        return self.secret_setting.partition("_")[0] + "_"


FORGES = (
    Forge("github", "GitHub", "gh", "apps.receiver.hooks.github", "apps.worker.forges.github.GitHubClient",
          ("labeled", "opened", "synchronize", "reopened", "review_submitted", "closed"),
          "apps.receiver.forge_config.github_config", "GITHUB_WEBHOOK_SECRET", "GITHUB_TOKEN", "GITHUB_API_URL",
          "GITHUB_WEB_URL", close_word="closed", pr_label_action="labeled", api_gated=False),
    Forge("gitlab", "GitLab", "gl", "apps.receiver.hooks.gitlab", "apps.worker.forges.gitlab.GitLabClient",
          ("open", "update", "reopen", "approved", "close"),
          "apps.receiver.forge_config.gitlab_config", "GITLAB_WEBHOOK_SECRET", "GITLAB_TOKEN", "GITLAB_URL",
          "GITLAB_WEB_URL", issue_page="{repo}/-/issues/{number}", pull_page="{repo}/-/merge_requests/{number}",
          close_word="close", separate_pr_numbering=True, lookup_pending_reason="access-lookup-failed"),
    Forge("forgejo", "Forgejo / Gitea", "fj", "apps.receiver.hooks.forgejo", "apps.worker.forges.forgejo.ForgejoClient",
          ("label_updated", "opened", "synchronized", "reopened", "closed"),
          "apps.receiver.forge_config.forgejo_config", "FORGEJO_WEBHOOK_SECRET", "FORGEJO_TOKEN", "FORGEJO_URL",
          "FORGEJO_WEB_URL", pull_page="{repo}/pulls/{number}", close_word="closed", pr_label_action="label_updated"),
    Forge("azure", "Azure DevOps", "az", "apps.receiver.hooks.azure", "apps.worker.forges.azure.AzureClient",
          ("created", "updated"),
          "apps.receiver.forge_config.azure_config", "AZURE_WEBHOOK_SECRET", "AZURE_TOKEN", "AZURE_ORG_URL",
          "AZURE_WEB_URL", issue_page="{owner}/_workitems/edit/{number}",
          pull_page="{owner}/_git/{name}/pullrequest/{number}", separate_pr_numbering=True,
          lookup_pending_reason="membership-lookup-failed"),
)
BY_NAME = {forge.name: forge for forge in FORGES}
NAMES = tuple(BY_NAME)


def register(forge: Forge) -> None:
    """Add a forge from outside this repository. Call it from the settings module: the tables built from this one
    (hook URLs, run kinds, validators, form choices) are built once, when the apps load."""
    global FORGES, NAMES
    if forge.name in BY_NAME or forge.job_prefix in {known.job_prefix for known in FORGES}:
        raise ValueError(f"a forge named {forge.name!r} or with job prefix {forge.job_prefix!r} is registered")
    FORGES = (*FORGES, forge)
    BY_NAME[forge.name] = forge
    NAMES = tuple(BY_NAME)


def get(name: str) -> Forge:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"no forge {name!r}: one of {', '.join(NAMES)}") from None


def hook(name: str):
    return import_module(get(name).hook_module)


def client_class(name: str):
    return import_string(get(name).client_class)


def config(name: str):
    """The receiver's configuration of the forge from settings alone, or None when it is not served."""
    return import_string(get(name).config_reader)()


# --- its web pages: every link to an issue or a pull request, on every page and in every message ---------------

def web_root_of_api(api_url: str) -> str:
    """Where a forge's pages are, given where its API is: GitHub's API host is api.github.com and GitHub Enterprise
    Server's API is under /api/v3; the other forges (and the stand-in forge) serve pages and API on one root."""
    root = (api_url or "").strip().rstrip("/")
    parts = urlsplit(root)
    if parts.hostname == "api.github.com":
        return f"{parts.scheme}://github.com"
    return root[:-len("/api/v3")] if root.endswith("/api/v3") else root


def web_root(name: str) -> str:
    """The forge's web pages' root as this deployment is configured ("" when it cannot be known)."""
    forge = get(name)
    configured = str(getattr(settings, forge.web_url_setting, "") or "").strip().rstrip("/")
    return configured or web_root_of_api(str(getattr(settings, forge.api_url_setting, "") or ""))


def _page(name: str, template: str, repo: str, number: int, root: str | None) -> str:
    root = web_root(name) if root is None else root.rstrip("/")
    owner, _, repo_name = (repo or "").partition("/")
    if not root or not owner or not str(number).isdigit():
        return ""
    path = template.format(repo=quote(repo, safe="/"), owner=quote(owner, safe=""),
                           name=quote(repo_name, safe="/"), number=int(number))
    return f"{root}/{path}"


def issue_url(name: str, repo: str, number: int, *, root: str | None = None) -> str:
    """An issue's (Azure DevOps: a work item's) page; "" when it cannot be known."""
    return _page(name, get(name).issue_page, repo, number, root)


def pull_url(name: str, repo: str, number: int, *, root: str | None = None) -> str:
    """A pull/merge request's page; "" when it cannot be known."""
    return _page(name, get(name).pull_page, repo, number, root)


def target_url(name: str, target: str) -> str:
    """The page of a run's target, `<repo>#<n>` (an issue; GitHub and Forgejo send an issue link on to its pull
    request) or `<repo>!<n>` (a pull/merge request where they count apart); "" for anything else."""
    if name not in BY_NAME:
        return ""
    repo, separator, number = (target or "").rpartition("!" if "!" in (target or "") else "#")
    if not separator or not number.isdigit():
        return ""
    return (pull_url if separator == "!" else issue_url)(name, repo, int(number))
