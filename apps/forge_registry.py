"""The forges this deployment can serve, in one table. Whatever differs by forge only in its name (the hook's
URL, the job-id prefix, the hook module that verifies and reads a delivery, the API client, the words its
events use) is read from here, never spelled out again.

    forge_registry.NAMES                    ("github", "gitlab", "forgejo", "azure")
    forge_registry.get("gitlab").job_prefix "gl"
    forge_registry.hook("gitlab")           apps.receiver.hooks.gitlab (verify, normalise)
    forge_registry.client_class("gitlab")   apps.worker.forges.gitlab.GitLabClient (from_settings)

A fifth forge is one entry here, its hook module (apps/receiver/hooks/), its client (apps/worker/forges/) and
their tests; its settings are its client's `from_settings` and apps/receiver/forge_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

from django.utils.module_loading import import_string


@dataclass(frozen=True)
class Forge:
    name: str                   # in URLs (/hooks/<name>), run kinds, settings, logs
    label: str                  # for people
    job_prefix: str             # a delivery's job id is <prefix>-<delivery id>
    hook_module: str            # verify(request, config) and normalise(event, delivery_id, payload)
    client_class: str           # a ForgeClient with from_settings(timeout=, cache_seconds=)
    pr_actions: tuple[str, ...]  # the pull request actions a trigger's `on.actions` may name
    close_word: str = ""        # the action that closes an issue ("" : no close triggers)
    pr_label_action: str = ""   # the pull request action that means "a label was applied" ("": none)
    separate_pr_numbering: bool = False  # pull requests count apart from issues, written `!n`
    # Whether an API lookup of the actor's access is needed before a match starts work (GitHub's `labeled`
    # is approval in itself), and the inbox reason when that lookup cannot be answered.
    api_gated: bool = True
    lookup_pending_reason: str = "permission-lookup-failed"


FORGES = (
    Forge("github", "GitHub", "gh", "apps.receiver.hooks.github", "apps.worker.forges.github.GitHubClient",
          ("labeled", "opened", "synchronize", "reopened", "review_submitted", "closed"),
          close_word="closed", pr_label_action="labeled", api_gated=False),
    Forge("gitlab", "GitLab", "gl", "apps.receiver.hooks.gitlab", "apps.worker.forges.gitlab.GitLabClient",
          ("open", "update", "reopen", "approved", "close"),
          close_word="close", separate_pr_numbering=True, lookup_pending_reason="access-lookup-failed"),
    Forge("forgejo", "Forgejo / Gitea", "fj", "apps.receiver.hooks.forgejo", "apps.worker.forges.forgejo.ForgejoClient",
          ("label_updated", "opened", "synchronized", "reopened", "closed"),
          close_word="closed", pr_label_action="label_updated"),
    Forge("azure", "Azure DevOps", "az", "apps.receiver.hooks.azure", "apps.worker.forges.azure.AzureClient",
          ("created", "updated"), separate_pr_numbering=True, lookup_pending_reason="membership-lookup-failed"),
)
BY_NAME = {forge.name: forge for forge in FORGES}
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
