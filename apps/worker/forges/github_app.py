"""A GitHub App as a credential: a JWT signed RS256 with the App's private key, exchanged for an
installation token scoped to the one repository a job (or a lookup, or a comment) is about.

    app = GitHubApp(app_id="12345", installation_id="678", private_key=pem, api_url=..., timeout=3)
    app.installation_token("acme/web")                               # for a job: ~1 hour, one repository
    app.installation_token("acme/web", {"metadata": "read"})         # narrowed, for a permission lookup

The JWT is backdated 60 s (clock drift) and lives 10 minutes at most, as GitHub requires. Tokens for
lookups and comments are cached until 5 minutes before they expire; a job's token is minted per job and
revoked when the job is over. Nothing here logs a token, a JWT or the key.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import jwt

from apps.worker.forges.base import (
    Credential,
    ForgeFailure,
    TTLCache,
    Unreachable,
    failure_for,
    failure_for_unreachable,
    request_json,
)

JWT_BACKDATE_SECONDS = 60
JWT_LIFETIME_SECONDS = 540  # + the 60 s backdate = GitHub's 10-minute maximum
REUSE_MARGIN_SECONDS = 300
logger = logging.getLogger("pidispatch.forges")
API_HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
               "User-Agent": "pidispatch"}


class AppKeyError(Exception):
    """The private key is missing or unreadable (a configuration error; the message names no secret)."""


def load_private_key(text: str, path: str) -> str:
    """The PEM from GITHUB_APP_PRIVATE_KEY (literal `\\n` escapes allowed, as .env files carry them) or
    else from the file GITHUB_APP_PRIVATE_KEY_PATH."""
    if text.strip():
        pem = text.strip().replace("\\n", "\n")
    elif path.strip():
        try:
            pem = Path(path.strip()).read_text()
        except OSError as error:
            raise AppKeyError(f"GITHUB_APP_PRIVATE_KEY_PATH cannot be read ({type(error).__name__})") from None
    else:
        raise AppKeyError("GITHUB_APP_PRIVATE_KEY or GITHUB_APP_PRIVATE_KEY_PATH is required with GITHUB_APP_ID")
    if "PRIVATE KEY-----" not in pem:
        raise AppKeyError("the GitHub App private key is not a PEM private key (download it from the App's settings)")
    return pem


@dataclass(frozen=True)
class InstallationToken(Credential):
    repositories: tuple[str, ...] = ()


class GitHubApp:
    token_cache = TTLCache(max_entries=256)

    def __init__(self, *, app_id: str, installation_id: str, private_key: str, api_url: str, timeout: float,
                 problem: str = ""):
        self.app_id = app_id
        self.installation_id = installation_id
        self.private_key = private_key
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self.problem = problem  # what is wrong with the App's settings; every use then refuses

    def jwt(self) -> str:
        if self.problem:
            logger.error("github_app_unconfigured detail=%r", self.problem)
            raise ForgeFailure("forge-unconfigured", transient=False)
        now = int(time.time())
        claims = {"iat": now - JWT_BACKDATE_SECONDS, "exp": now + JWT_LIFETIME_SECONDS, "iss": self.app_id}
        try:
            return jwt.encode(claims, self.private_key, algorithm="RS256")
        except (ValueError, TypeError, jwt.PyJWTError):
            # Unparseable key material: a configuration error, never retried into the same failure.
            raise ForgeFailure("forge-unconfigured", transient=False) from None

    def installation_token(self, repo: str, permissions: dict[str, str] | None = None, *,
                           reuse: bool = False, installation_id: str = "") -> InstallationToken:
        """A token for the installation (GITHUB_APP_INSTALLATION_ID, or `installation_id`: another account's),
        limited to `repo` (owner/name) and, when given, `permissions`. `reuse` takes a cached token that still has
        more than 5 minutes to live."""
        installation_id = installation_id or self.installation_id
        key = self._cache_key(repo, permissions, installation_id)
        if reuse:
            cached = self.token_cache.get(key)
            if cached is not None:
                return cached
        owner, _, name = repo.partition("/")
        body: dict = {"repositories": [name]} if repo else {}  # "": every repository of the installation
        if permissions:
            body["permissions"] = permissions
        try:
            response = request_json(
                "POST", f"{self.api_url}/app/installations/{installation_id}/access_tokens",
                {**API_HEADERS, "Authorization": f"Bearer {self.jwt()}"}, self.timeout, body=body,
            )
        except Unreachable as error:
            raise failure_for_unreachable(error) from None
        if response.status == 422:
            # The repository is not in this installation (or a permission the App was not granted).
            raise ForgeFailure("forge-repo-not-found", transient=False)
        if response.status != 201:
            raise failure_for(response)
        token = self._parse(response.data, repo)
        if reuse and token.expires_at is not None:
            ttl = (token.expires_at - datetime.now(UTC)).total_seconds() - REUSE_MARGIN_SECONDS
            self.token_cache.put(key, token, ttl)
        return token

    def revoke(self, token: str) -> bool:
        """DELETE /installation/token with the token itself: it stops working at once (204)."""
        try:
            response = request_json("DELETE", f"{self.api_url}/installation/token",
                                    {**API_HEADERS, "Authorization": f"Bearer {token}"}, self.timeout)
        except Unreachable:
            return False
        return response.status == 204

    def app_slug(self) -> str:
        """The App's slug (`GET /app` with the JWT): its bot account is `<slug>[bot]`."""
        response = request_json("GET", f"{self.api_url}/app", {**API_HEADERS, "Authorization": f"Bearer {self.jwt()}"},
                                self.timeout)
        if response.status != 200:
            raise failure_for(response)
        slug = response.data.get("slug") if isinstance(response.data, dict) else None
        if not isinstance(slug, str) or not slug:
            raise ForgeFailure("forge-malformed-answer", transient=True)
        return slug

    def organization_installation(self, organization: str) -> str:
        """The id of the App's installation on `organization` (`GET /orgs/{org}/installation` with the JWT); an
        organization the App is not installed on is `fork-unavailable`."""
        try:
            response = request_json("GET", f"{self.api_url}/orgs/{quote(organization, safe='')}/installation",
                                    {**API_HEADERS, "Authorization": f"Bearer {self.jwt()}"}, self.timeout)
        except Unreachable as error:
            raise failure_for_unreachable(error) from None
        if response.status == 404:
            raise ForgeFailure("fork-unavailable", transient=False)
        if response.status != 200:
            raise failure_for(response)
        installation = response.data.get("id") if isinstance(response.data, dict) else None
        if not isinstance(installation, int) or isinstance(installation, bool):
            raise ForgeFailure("forge-malformed-answer", transient=True)
        return str(installation)

    def _cache_key(self, repo: str, permissions: dict[str, str] | None, installation_id: str) -> tuple:
        # The key's fingerprint, not the key: a rotated key must not be served tokens minted by the old one.
        key_print = hashlib.sha256(self.private_key.encode()).hexdigest()[:16]
        return (self.api_url, self.app_id, installation_id, key_print, repo.lower(),
                tuple(sorted((permissions or {}).items())))

    @staticmethod
    def _parse(data, repo: str) -> InstallationToken:
        if not isinstance(data, dict) or not isinstance(data.get("token"), str) or not data["token"]:
            raise ForgeFailure("forge-malformed-answer", transient=True)
        names = tuple(
            entry["full_name"] for entry in data.get("repositories") or []
            if isinstance(entry, dict) and isinstance(entry.get("full_name"), str)
        )
        # The token is scoped by repository NAME within the installation's account: it must be this repo.
        if repo and names and [name.lower() for name in names] != [repo.lower()]:
            raise ForgeFailure("forge-repo-not-found", transient=False)
        expires_at = None
        if isinstance(data.get("expires_at"), str):
            try:
                expires_at = datetime.fromisoformat(data["expires_at"].replace("Z", "+00:00"))
            except ValueError:
                expires_at = None
        if expires_at is None:
            expires_at = datetime.now(UTC) + timedelta(minutes=55)
        return InstallationToken(token=data["token"], source="app", expires_at=expires_at, repositories=names)
