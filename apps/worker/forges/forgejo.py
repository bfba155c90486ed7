"""Forgejo / Gitea API (v1): a user's permission on a repository, and who our own token belongs to."""

from __future__ import annotations

from .base import Authority, ForgeClient, Identity, Subject

WRITE_PERMISSIONS = {"owner", "admin", "write"}


class ForgejoClient(ForgeClient):
    forge = "forgejo"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}", "User-Agent": "pidispatch"}

    def _lookup_authority(self, subject: Subject) -> Authority:
        # A 403 stays "could not tell": a token that may not read permissions is a configuration problem to
        # surface (the delivery waits in the inbox), not a silent "no".
        return self._repository_permission("{base}/api/v1/repos/{owner}/{name}/collaborators/{login}/permission",
                                           subject, WRITE_PERMISSIONS)

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}/api/v1/user")
