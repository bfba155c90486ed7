"""GitHub REST API: the closer's repository permission, and who our own token belongs to."""

from __future__ import annotations

from .base import Authority, ForgeClient, Identity, Subject

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
        if not self.token:
            return Authority.unknown("no-token")
        return self._repository_permission("{base}/repos/{owner}/{name}/collaborators/{login}/permission", subject,
                                           WRITE_PERMISSIONS)

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}/user")
