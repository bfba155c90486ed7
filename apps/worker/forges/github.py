"""GitHub REST API: the closer's repository permission, and who our own token belongs to."""

from __future__ import annotations

from .base import Authority, ForgeClient, Identity, Subject, safe_path_part, split_repo

# The legacy `permission` field folds `maintain` into `write`; both spellings count.
WRITE_PERMISSIONS = {"admin", "maintain", "write"}


class GitHubClient(ForgeClient):
    forge = "github"

    def _headers(self) -> dict[str, str]:
        return {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "Authorization": f"Bearer {self.token}",
            "User-Agent": "pidispatch",
        }

    def _lookup_authority(self, subject: Subject) -> Authority:
        """Write access of `subject.login` to `subject.repo` (close rules are gated on the closer)."""
        repo = split_repo(subject.repo)
        if repo is None or not safe_path_part(subject.login):
            return Authority.no("unaskable")
        if not self.token:
            return Authority.unknown("no-token")
        owner, name = repo
        response = self._get(f"{self.base_url}/repos/{owner}/{name}/collaborators/{subject.login}/permission")
        if response.status == 404:
            return Authority.no("not-collaborator")
        if response.status != 200:
            return Authority.unknown(f"status-{response.status}")
        permission = response.data.get("permission") if isinstance(response.data, dict) else None
        if not isinstance(permission, str):
            return Authority.unknown("malformed-answer")
        if permission in WRITE_PERMISSIONS:
            return Authority.yes(permission)
        return Authority.no("read-only")

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}/user")
