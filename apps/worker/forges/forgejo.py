"""Forgejo / Gitea API (v1): a user's permission on a repository, who our own token belongs to, the
default branch and its protection, and status comments. A job acts with FORGEJO_TOKEN."""

from __future__ import annotations

from urllib.parse import quote

from .base import (Authority, BranchHead, Credential, ForgeClient, ForgeFailure, Identity, RepoRef, Response,
    Subject, repo_halves)

WRITE_PERMISSIONS = {"owner", "admin", "write"}


class ForgejoClient(ForgeClient):
    forge = "forgejo"
    token_variables = ("FORGEJO_TOKEN",)
    url_variable = "FORGEJO_URL"
    git_user = "pidispatch"  # Forgejo reads the token from the password; the user name is not checked

    def _auth_headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"token {token}", "User-Agent": "pidispatch"}

    # --- receiver ---

    def _lookup_authority(self, subject: Subject) -> Authority:
        # A 403 stays "could not tell": a token that may not read permissions is a configuration problem to
        # surface (the delivery waits in the inbox), not a silent "no".
        return self._repository_permission("{base}/api/v1/repos/{owner}/{name}/collaborators/{login}/permission",
                                           subject, WRITE_PERMISSIONS)

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}/api/v1/user")

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
