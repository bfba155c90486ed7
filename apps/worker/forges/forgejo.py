"""Forgejo / Gitea API (v1): a user's permission on a repository, who our own token belongs to, the
default branch and its protection, status comments, and pull requests (a head, finding and opening one).
A job acts with FORGEJO_TOKEN."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from django.conf import settings

from apps.worker.forges.base import (
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
    is_int_like,
    repo_halves,
)

WRITE_PERMISSIONS = {"owner", "admin", "write"}
# The pull request listing has no head/base filter: open ones are read a page at a time, most recently
# updated first (a retried publish's own is near the top), up to this many pages.
PAGE_SIZE = 50  # the default [api] MAX_RESPONSE_ITEMS; a server may answer with fewer per page
MAX_PAGES = 20


class ForgejoClient(ForgeClient):
    forge = "forgejo"
    forks = True

    @classmethod
    def from_settings(cls, **common) -> ForgejoClient:
        return cls(base_url=settings.FORGEJO_URL, token=settings.FORGEJO_TOKEN, **common)
    token_variables = ("FORGEJO_TOKEN",)
    identity_path = "/api/v1/user"
    url_variable = "FORGEJO_URL"
    git_user = "pidispatch"  # Forgejo reads the token from the password; the user name is not checked
    # Comments and descriptions are LONGTEXT columns with no limit in the API (models/issues/comment.go):
    # conservative, a MySQL TEXT's 65,535. Titles are VARCHAR(255).
    max_comment_chars = 65_535
    max_description_chars = 65_535
    # Git pushes have no default file size limit; the documented default for files added through the web
    # ([repository.upload] FILE_MAX_SIZE, forgejo.org config cheat sheet) is 50 MB: conservative, that.
    max_file_bytes = 50 * 1024 * 1024
    # [repository.pull-request] WORK_IN_PROGRESS_PREFIXES defaults to `WIP:,[WIP]`: the title marks a draft.
    draft_prefix = "WIP: "

    def _auth_headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"token {token}", "User-Agent": "pidispatch"}

    # --- receiver ---

    def _lookup_authority(self, subject: Subject) -> Authority:
        # A 403 stays "could not tell": a token that may not read permissions is a configuration problem to
        # surface (the delivery waits in the inbox), not a silent "no".
        return self._repository_permission("{base}/api/v1/repos/{owner}/{name}/collaborators/{login}/permission",
                                           subject, WRITE_PERMISSIONS)

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}{self.identity_path}")

    # --- worker ---

    def _default_branch(self, ref: RepoRef, credential: Credential) -> BranchHead:
        owner, name = repo_halves(ref)
        repo_url = f"{self.base_url}/api/v1/repos/{owner}/{name}"
        repository = self._answer(self._get(repo_url, credential.token))
        branch_name = repository.get("default_branch")
        if not isinstance(branch_name, str) or not branch_name or repository.get("empty") is True:
            raise ForgeFailure("default-branch-missing", transient=False)
        branch, commit = self._branch(f"{repo_url}/branches/{quote(branch_name, safe='')}", credential)
        return self._branch_head(branch_name, commit.get("id"), branch.get("protected"), repository.get("clone_url"))

    def _post_comment(self, ref: RepoRef, target_type: str, number: int, text: str,
                      credential: Credential) -> Response:
        # Pull requests share the issues' numbering and comment endpoint.
        owner, name = repo_halves(ref)
        return self._send("POST", f"{self.base_url}/api/v1/repos/{owner}/{name}/issues/{number}/comments",
                          {"body": text}, credential.token)

    # --- pull requests ---

    def _pulls_url(self, ref: RepoRef) -> str:
        owner, name = repo_halves(ref)
        return f"{self.base_url}/api/v1/repos/{owner}/{name}/pulls"

    def _pull_head(self, ref: RepoRef, number: int, credential: Credential) -> PullHead:
        pull = self._pull(self._get(f"{self._pulls_url(ref)}/{number}", credential.token))
        return self._shared_shape_head(pull, number, _same_repository)

    def _find_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str,
                           credential: Credential, same_repository=None) -> PullRequest | None:
        """The open one from `head_branch` of this repository (or whose head `same_repository` accepts)."""
        same_repository = same_repository or _same_repository
        found, seen = [], 0
        for page in range(1, MAX_PAGES + 1):
            query = urlencode({"state": "open", "sort": "recentupdate", "page": page, "limit": PAGE_SIZE})
            response = self._get(f"{self._pulls_url(ref)}?{query}", credential.token)
            pulls = self._answer(response, list)
            found += self._shared_shape_open(pulls, head_branch, base_branch, same_repository)
            seen += len(pulls)
            total = response.headers.get("x-total-count", "")
            if found or not pulls or (total.isdigit() and seen >= int(total)):
                break
        else:
            # Not among the first pages: "none" could open a second one, so it is a refusal instead.
            raise ForgeFailure("forge-listing-too-large", transient=False)
        return self._oldest(ref, found, "number")

    def _open_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str, title: str, body: str,
                           draft: bool, issue_number: int | None, credential: Credential) -> Response:
        return self._send("POST", self._pulls_url(ref), {"head": head_branch, "base": base_branch, "title": title,
                                                          "body": body}, credential.token)

    def _opened(self, ref: RepoRef, data: dict) -> PullRequest:
        return self._pull_request_of(ref, data.get("number"))

    # --- the deployment's fork ---

    def _fork(self, ref: RepoRef, credential: Credential) -> Fork:
        return self._shared_shape_fork(f"{self.base_url}/api/v1", ref, credential)

    def _fork_head(self, fork: Fork, head_branch: str) -> str:
        return self._owner_head(fork, head_branch)

    def _find_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str,
                                credential: Credential) -> PullRequest | None:
        return self._find_pull_request(ref, head_branch, base_branch, credential, self._from_fork(fork))

    def _already_exists(self, response: Response) -> bool:
        # 409 "pull request already exists for these targets [...]"
        return response.status == 409



def _same_repository(head: dict, base: dict) -> bool:
    """`repo_id` of the head and base branch info; a fork's deleted repository is 0 or absent."""
    head_id, base_id = head.get("repo_id"), base.get("repo_id")
    return is_int_like(head_id) and head_id > 0 and head_id == base_id
