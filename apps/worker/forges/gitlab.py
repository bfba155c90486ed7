"""GitLab REST API (v4): a member's access level on a project, who our own token belongs to, the default
branch and its protection, status comments (notes), and merge requests (a head, finding and opening one).
A job acts with GITLAB_TOKEN (a project, group or personal access token)."""

from __future__ import annotations

import time
from urllib.parse import quote, urlencode

from django.conf import settings

from apps.worker.forges.base import (
    FORK_READY_SECONDS,
    Authority,
    BranchHead,
    Credential,
    ForgeClient,
    ForgeFailure,
    Fork,
    Identity,
    PullHead,
    PullRequest,
    RepoRef,
    Response,
    Subject,
    fork_refused,
    is_int_like,
    part,
)

DEVELOPER_ACCESS = 30  # Developer and above may start work (Guest 10, Reporter 20, Maintainer 40, Owner 50)


def project_ref(project_id: str, path: str) -> str | None:
    """The numeric id when known; otherwise the URL-encoded path, which the API also accepts."""
    if project_id.isdigit():
        return project_id
    if path and "/" in path and ".." not in path.split("/") and not any(ch.isspace() for ch in path):
        return quote(path, safe="")
    return None


class GitLabClient(ForgeClient):
    forks = True
    forge = "gitlab"

    @classmethod
    def from_settings(cls, **common) -> GitLabClient:
        return cls(base_url=settings.GITLAB_URL, token=settings.GITLAB_TOKEN, **common)
    token_variables = ("GITLAB_TOKEN",)
    identity_path = "/api/v4/user"
    url_variable = "GITLAB_HOST"  # glab's name for the instance
    git_user = "oauth2"
    # Notes and descriptions are validated to Gitlab::Database::MAX_TEXT_SIZE_LIMIT, 1,000,000 characters
    # (gitlab-foss commit 5af535d9, "Limit the size of issuable description and comments"); titles to 255.
    max_comment_chars = 1_000_000
    max_description_chars = 1_000_000
    # GitLab has no per-file default (push rules' max_file_size is off; self-managed has no default maximum
    # push size, GitLab.com's is 5 GiB): conservative, GitHub's 100 MiB.
    max_file_bytes = 100 * 1024 * 1024
    # docs.gitlab.com, "Draft merge requests": a title starting with `Draft:` marks the merge request a draft;
    # the create API has no draft attribute (its answer's `draft` reflects the title).
    draft_prefix = "Draft: "

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
            return Authority.unanswered(response)
        level = response.data.get("access_level") if isinstance(response.data, dict) else None
        if not is_int_like(level):
            return Authority.unknown("malformed-answer")
        return Authority.yes(f"access-{level}") if level >= DEVELOPER_ACCESS else Authority.no(f"access-{level}")

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}{self.identity_path}")

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

    # --- merge requests ---

    def _pull_head(self, ref: RepoRef, number: int, credential: Credential) -> PullHead:
        request = self._pull(self._get(f"{self._project_url(ref)}/merge_requests/{number}", credential.token))
        source, target = request.get("source_project_id"), request.get("target_project_id")
        same = is_int_like(source) and source == target
        return self._pull_head_of(request.get("iid"), asked=number, sha=request.get("sha"),
                                  branch=request.get("source_branch"), same_repository=same,
                                  fetch_ref=f"refs/merge-requests/{number}/head", open=request.get("state") == "opened")

    def _find_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str,
                           credential: Credential) -> PullRequest | None:
        # A fork's merge request into this project can have the same source branch name: only one whose source
        # project is the target project counts.
        def from_this_project(request: dict) -> bool:
            return (is_int_like(request.get("source_project_id"))
                    and request.get("source_project_id") == request.get("target_project_id")
                    and (not ref.project_id.isdigit() or request.get("target_project_id") == int(ref.project_id)))

        return self._open_request(ref, head_branch, base_branch, credential, from_this_project)

    def _open_request(self, ref: RepoRef, head_branch: str, base_branch: str, credential: Credential,
                      from_source) -> PullRequest | None:
        """The oldest open merge request from `head_branch` into `base_branch` whose source `from_source` accepts
        (the listing's `state` defaults to all)."""
        query = urlencode({"state": "opened", "source_branch": head_branch, "target_branch": base_branch,
                           "per_page": 100})
        requests = self._answer(self._get(f"{self._project_url(ref)}/merge_requests?{query}", credential.token), list)
        found = [request for request in requests if isinstance(request, dict) and request.get("state") == "opened"
                 and request.get("source_branch") == head_branch and request.get("target_branch") == base_branch
                 and from_source(request) and is_int_like(request.get("iid"))]
        return self._oldest(ref, found, "iid")

    def _open_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str, title: str, body: str,
                           draft: bool, issue_number: int | None, credential: Credential) -> Response:
        return self._send("POST", f"{self._project_url(ref)}/merge_requests",
                          {"source_branch": head_branch, "target_branch": base_branch, "title": title,
                           "description": body}, credential.token)

    def _opened(self, ref: RepoRef, data: dict) -> PullRequest:
        return self._pull_request_of(ref, data.get("iid"))

    # --- the deployment's fork ---

    def _fork(self, ref: RepoRef, credential: Credential) -> Fork:
        """POST /projects/:id/fork makes the token's user's fork (409: the user has a project of that name: its
        fork, when it is one); then its own GET, until GitLab has copied the repository (`import_status`)."""
        if not ref.project_id.isdigit():
            raise ForgeFailure("fork-unavailable", transient=False)
        project_url = self._project_url(ref)
        response = self._send("POST", f"{project_url}/fork", {}, credential.token)
        if response.status == 409:
            owned = self._answer(self._get(f"{project_url}/forks?owned=true&per_page=100", credential.token), list)
            data = next((item for item in owned if isinstance(item, dict)), {})
        elif response.status in (200, 201, 202):
            data = response.data if isinstance(response.data, dict) else {}
        else:
            raise fork_refused(response)
        fork_id, path = data.get("id"), data.get("path_with_namespace")
        parent = part(data, "forked_from_project").get("id")
        if not is_int_like(fork_id) or not isinstance(path, str) or not path or parent != int(ref.project_id) \
                or fork_id == parent:
            raise ForgeFailure("fork-unavailable", transient=False)  # what answered is not a fork of this one
        fork = Fork(repo=path, clone_url=self.own_clone_url(data.get("http_url_to_repo")), project_id=str(fork_id))
        deadline = time.monotonic() + FORK_READY_SECONDS
        while True:
            project = self._answer(self._get(f"{self.base_url}/api/v4/projects/{fork_id}", credential.token))
            if project.get("import_status") in (None, "none", "finished"):
                return fork
            if project.get("import_status") == "failed" or time.monotonic() > deadline:
                raise ForgeFailure("fork-not-ready", transient=True)
            time.sleep(1)

    def _open_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str, title: str,
                                body: str, draft: bool, issue_number: int | None, credential: Credential) -> Response:
        """Created on the fork, its target this project."""
        return self._send("POST", f"{self.base_url}/api/v4/projects/{fork.project_id}/merge_requests",
                          {"source_branch": head_branch, "target_branch": base_branch, "title": title,
                           "description": body, "target_project_id": int(ref.project_id)}, credential.token)

    def _find_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str,
                                credential: Credential) -> PullRequest | None:
        return self._open_request(ref, head_branch, base_branch, credential,
                                  lambda request: str(request.get("source_project_id")) == fork.project_id)

    def _already_exists(self, response: Response) -> bool:
        # 409 {"message": ["Another open merge request already exists for this source branch: !<iid>"]}; other
        # branch validations (the same branch for source and target, ...) answer 409 too.
        message = response.data.get("message") if isinstance(response.data, dict) else None
        messages = message if isinstance(message, list) else [message]
        return response.status == 409 and any(isinstance(text, str) and "already exists" in text for text in messages)
