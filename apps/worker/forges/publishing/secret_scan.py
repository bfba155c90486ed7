"""The agent's work is read for the deployment's secrets before any of it is pushed: every file the work adds or
changes and every commit message, as written and as a forge's page would show them (apps/worker/scrubbing.py).

A file cannot be scrubbed without changing what the agent wrote, so a hit refuses the push (`secret-in-work`),
saying where (the file's path, or the commit) and which secret by its name (ANTHROPIC_API_KEY, GITHUB_TOKEN, a
run.secrets name), never the secret; the work is kept for the operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from apps.worker.forges.publishing.work import GITLINK_MODE, Work, git
from apps.worker.scrubbing import ENCODED_MIN_CHARS, Scrubber


@dataclass(frozen=True)
class Finding:
    where: str  # a path of the work, or `commit <sha>`
    secret: str  # the secret's name

    def __str__(self) -> str:
        return f"{self.where} holds {self.secret}"


def first_secret(work: Work, secrets: Mapping[str, str]) -> Finding | None:
    """The first commit message or changed file of `work` that holds one of `secrets` (name -> value), or None. A
    value shorter than ENCODED_MIN_CHARS is not looked for: in a whole file it would match ordinary text."""
    secrets = {name: value for name, value in secrets.items() if value and len(value) >= ENCODED_MIN_CHARS}
    if work.empty or not secrets:
        return None
    scrubber = Scrubber(secrets)
    listing = git(work.store, "log", "-z", "--format=%H%n%B", f"{work.start}..{work.head}").stdout
    for entry in listing.split("\0"):
        sha, _, message = entry.strip("\n").partition("\n")
        name = scrubber.which(message)
        if name is not None:
            return Finding(f"commit {sha[:12]}", name)
    for change in work.changes:
        if change.status == "D" or change.new_mode == GITLINK_MODE:
            continue
        name = scrubber.which(git(work.store, "cat-file", "blob", change.blob).stdout)
        if name is not None:
            return Finding(change.path, name)
    return None
