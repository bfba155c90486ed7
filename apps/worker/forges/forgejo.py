"""Forgejo / Gitea API (v1): a user's permission on a repository, and who our own token belongs to."""

from __future__ import annotations

from .base import Authority, ForgeClient, Identity, Subject, safe_path_part, split_repo

WRITE_PERMISSIONS = {"owner", "admin", "write"}


class ForgejoClient(ForgeClient):
    forge = "forgejo"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}", "User-Agent": "pidispatch"}

    def _lookup_authority(self, subject: Subject) -> Authority:
        repo = split_repo(subject.repo)
        if repo is None or not safe_path_part(subject.login):
            return Authority.no("unaskable")
        owner, name = repo
        response = self._get(f"{self.base_url}/api/v1/repos/{owner}/{name}/collaborators/{subject.login}/permission")
        if response.status == 404:
            return Authority.no("not-collaborator")
        if response.status != 200:
            # 403 included: a token that may not read permissions is a configuration problem to surface,
            # not a silent "no".
            return Authority.unknown(f"status-{response.status}")
        permission = response.data.get("permission") if isinstance(response.data, dict) else None
        if not isinstance(permission, str):
            return Authority.unknown("malformed-answer")
        return Authority.yes(permission) if permission in WRITE_PERMISSIONS else Authority.no("read-only")

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}/api/v1/user")
