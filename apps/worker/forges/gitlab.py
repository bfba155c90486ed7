"""GitLab REST API (v4): a member's access level on a project, who our own token belongs to, the default
branch and its protection, and status comments (notes). A job acts with GITLAB_TOKEN (a project, group or
personal access token)."""

from __future__ import annotations

from urllib.parse import quote

from .base import (Authority, BranchHead, Credential, ForgeClient, ForgeFailure, Identity, RepoRef, Response,
    Subject, is_int_like)

DEVELOPER_ACCESS = 30  # Developer and above may start work (Guest 10, Reporter 20, Maintainer 40, Owner 50)


def project_ref(project_id: str, path: str) -> str | None:
    """The numeric id when known; otherwise the URL-encoded path, which the API also accepts."""
    if project_id.isdigit():
        return project_id
    if path and "/" in path and ".." not in path.split("/") and not any(ch.isspace() for ch in path):
        return quote(path, safe="")
    return None


class GitLabClient(ForgeClient):
    forge = "gitlab"
    token_variables = ("GITLAB_TOKEN",)
    url_variable = "GITLAB_HOST"  # glab's name for the instance
    git_user = "oauth2"

    def _auth_headers(self, token: str) -> dict[str, str]:
        return {"PRIVATE-TOKEN": token, "User-Agent": "pidispatch"}

    # --- receiver ---

    def _lookup_authority(self, subject: Subject) -> Authority:
        """`members/all` includes members inherited from groups."""
        project = project_ref(subject.project_id, subject.repo)
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

    # --- worker ---

    def _project_url(self, ref: RepoRef) -> str:
        project = project_ref(ref.project_id, ref.repo)
        if project is None:
            raise ForgeFailure("forge-repo-not-found", transient=False)
        return f"{self.base_url}/api/v4/projects/{project}"

    def _default_branch(self, ref: RepoRef, credential: Credential) -> BranchHead:
        project_url = self._project_url(ref)
        project = self._answer(self._get(project_url, credential.token))
        branch_name = project.get("default_branch")
        if not isinstance(branch_name, str) or not branch_name:  # an empty project has none
            raise ForgeFailure("default-branch-missing", transient=False)
        branch, commit = self._branch(f"{project_url}/repository/branches/{quote(branch_name, safe='')}", credential)
        # `protected` covers wildcard protection rules as well as the branch's own.
        return self._branch_head(branch_name, commit.get("id"), branch.get("protected"),
                                 project.get("http_url_to_repo"))

    def _post_comment(self, ref: RepoRef, target_type: str, number: int, text: str,
                      credential: Credential) -> Response:
        collection = "merge_requests" if target_type == "pull_request" else "issues"
        return self._send("POST", f"{self._project_url(ref)}/{collection}/{number}/notes", {"body": text},
                          credential.token)
