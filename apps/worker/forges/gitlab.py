"""GitLab REST API (v4): a member's access level on a project, and who our own token belongs to."""

from __future__ import annotations

from urllib.parse import quote

from .base import Authority, ForgeClient, Identity, Subject, is_int_like

DEVELOPER_ACCESS = 30  # Developer and above may start work (Guest 10, Reporter 20, Maintainer 40, Owner 50)


class GitLabClient(ForgeClient):
    forge = "gitlab"

    def _headers(self) -> dict[str, str]:
        return {"PRIVATE-TOKEN": self.token, "User-Agent": "pidispatch"}

    @staticmethod
    def _project_ref(subject: Subject) -> str | None:
        # The numeric id when the payload has one; otherwise the URL-encoded path, which the API also accepts.
        if subject.project_id.isdigit():
            return subject.project_id
        path = subject.repo
        if path and "/" in path and ".." not in path.split("/") and not any(ch.isspace() for ch in path):
            return quote(path, safe="")
        return None

    def _lookup_authority(self, subject: Subject) -> Authority:
        """`members/all` includes members inherited from groups."""
        project = self._project_ref(subject)
        if project is None or not subject.actor_id.isdigit():
            return Authority.no("unaskable")
        response = self._get(f"{self.base_url}/api/v4/projects/{project}/members/all/{subject.actor_id}")
        if response.status == 404:
            return Authority.no("not-member")
        if response.status != 200:
            return Authority.unknown(f"status-{response.status}")
        level = response.data.get("access_level") if isinstance(response.data, dict) else None
        if not is_int_like(level):
            return Authority.unknown("malformed-answer")
        return Authority.yes(f"access-{level}") if level >= DEVELOPER_ACCESS else Authority.no(f"access-{level}")

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}/api/v4/user")
