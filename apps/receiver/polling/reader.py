"""GitHub's REST API as the poller reads it: conditional GETs, the rate limit, the credential, the repositories.

A 304 (Not Modified) is GitHub's answer to an unchanged feed whose ETag we sent; it costs nothing of the hourly
rate budget. A 403 or 429 with `x-ratelimit-remaining: 0` (or a `retry-after`) stops the cycle until GitHub
says the budget is back. A credential is never logged.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.worker.forges import ForgeFailure, github_app_from_settings
from apps.worker.forges.base import Response, Unreachable, request_json, retry_after

REPO_PATTERN = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
INTERVAL_FLOOR_SECONDS = 30
HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
           "User-Agent": "pidispatch-poller"}
READ_PERMISSIONS = {"metadata": "read", "issues": "read", "pull_requests": "read"}


class RepoFailed(Exception):
    """One repository could not be read this cycle: `reason` is a token, `detail` a sentence for the operator."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class RateLimited(Exception):
    def __init__(self, until: float):
        super().__init__(f"rate limited until {until:.0f}")
        self.until = until


@dataclass
class Counts:
    """One cycle's numbers, for its summary line."""

    repos: int = 0
    fetched: int = 0  # answers with a body (each counted against the rate limit)
    not_modified: int = 0  # 304s (free)
    deliveries: int = 0  # items handed to the intake
    queued: int = 0  # of which started jobs
    duplicates: int = 0  # of which a webhook (or an earlier poll) had started already
    failed: int = 0  # repositories that could not be read
    rate_limited: bool = False  # GitHub's rate limit ended the cycle early


def poll_repos() -> tuple[str, ...]:
    """POLL_REPOS as owner/name entries (trimmed, de-duplicated); a malformed entry is a configuration error."""
    found = []
    for entry in settings.POLL_REPOS.split(","):
        entry = entry.strip()
        if not entry:
            continue
        if not REPO_PATTERN.fullmatch(entry) or entry.startswith(".") or "/." in entry:
            raise ImproperlyConfigured(f"POLL_REPOS: {entry!r} is not a GitHub repository name: write owner/name, "
                                       "comma-separated (for example acme/web,acme/api)")
        if entry.lower() not in (known.lower() for known in found):
            found.append(entry)
    return tuple(found)


def poll_interval() -> int:
    seconds = settings.POLL_INTERVAL_SECONDS
    if seconds <= 0:
        raise ImproperlyConfigured(f"POLL_INTERVAL_SECONDS={seconds}: give a number of seconds (at least "
                                   f"{INTERVAL_FLOOR_SECONDS})")
    return max(seconds, INTERVAL_FLOOR_SECONDS)


class Reader:
    def __init__(self, counts: Counts | None = None):
        self.base = settings.GITHUB_API_URL.rstrip("/")
        self.timeout = settings.PI_FORGE_API_TIMEOUT_SECONDS
        self.app = github_app_from_settings(self.timeout)
        if self.app is None and not settings.GITHUB_TOKEN:
            raise ImproperlyConfigured("the GitHub poller needs a credential: GITHUB_TOKEN, or a GitHub App "
                                       "(GITHUB_APP_ID, GITHUB_APP_INSTALLATION_ID and its private key)")
        self.counts = counts or Counts()
        self.poll_hint = 0  # GitHub's x-poll-interval, the longest seen

    def token(self, repo: str | None) -> str:
        if self.app is None:
            return settings.GITHUB_TOKEN
        try:
            if repo is None:
                return self.app.installation_token("", READ_PERMISSIONS, reuse=True).token  # the installation's list
            return self.app.installation_token(repo, READ_PERMISSIONS, reuse=True).token
        except ForgeFailure as failure:
            raise RepoFailed("token-failed", f"the GitHub App could not mint a token ({failure.reason})") from None

    def get(self, repo: str | None, path: str, params: dict | None = None, etag: str = "") -> Response:
        """GET `path` (under the API's base); a 304 when `etag` still holds. Failures other than 304 raise."""
        url = f"{self.base}{path}" + (f"?{urlencode(params)}" if params else "")
        headers = {**HEADERS, "Authorization": f"Bearer {self.token(repo)}"}
        if etag:
            headers["If-None-Match"] = etag
        try:
            response = request_json("GET", url, headers, self.timeout)
        except Unreachable as error:
            raise RepoFailed(error.reason, f"GitHub did not answer ({error.reason})") from None
        hint = response.headers.get("x-poll-interval", "")
        if hint.isdigit():
            self.poll_hint = max(self.poll_hint, int(hint))
        if response.status == 304:
            self.counts.not_modified += 1
            return response
        self.counts.fetched += 1
        if response.status in (403, 429) and (response.headers.get("x-ratelimit-remaining") == "0"
                                              or "retry-after" in response.headers):
            raise RateLimited(_reset_time(response))
        if response.status == 404:
            raise RepoFailed("not-found", f"GitHub answers 404 for {path}: no such repository, or the credential "
                                          "cannot read it (check POLL_REPOS: owner/name)")
        if response.status in (401, 403):
            raise RepoFailed("forbidden", f"GitHub refuses the credential for {path} ({response.status})")
        if response.status != 200:
            raise RepoFailed(f"http-{response.status}", f"GitHub answered {response.status} for {path}")
        return response

    def installation_repos(self) -> tuple[str, ...]:
        """The App installation's repositories (100 a page, at most 10 pages)."""
        found: list[str] = []
        for page in range(1, 11):
            data = self.get(None, "/installation/repositories", {"per_page": 100, "page": page}).data
            names = [repo.get("full_name") for repo in (data or {}).get("repositories", []) if isinstance(repo, dict)]
            found += [name for name in names if isinstance(name, str) and REPO_PATTERN.fullmatch(name)]
            if len(names) < 100:
                break
        return tuple(found)


def repo_path(repo: str) -> str:
    owner, _, name = repo.partition("/")
    return f"/repos/{quote(owner, safe='')}/{quote(name, safe='')}"


def _reset_time(response: Response) -> float:
    """When GitHub said to ask again (the forge clients' one reading of Retry-After and the rate-limit reset), else in
    a minute."""
    wait = retry_after(response)
    return time.time() + (60 if wait is None else wait)
