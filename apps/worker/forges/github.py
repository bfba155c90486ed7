"""GitHub REST API: an actor's repository permission (write access), who our own account is, a job's token, the default
branch and its protection, status comments, and pull requests (a head, finding and opening one).

Credentials: a GitHub App (GITHUB_APP_ID + GITHUB_APP_INSTALLATION_ID + private key), which mints a token
per job scoped to the one repository and to JOB_PERMISSIONS, or else a personal access token (GITHUB_TOKEN)
used as it is. When both are configured the App is used for everything (lookups, identity, jobs, comments).
"""

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
    IdentityUnavailable,
    PullHead,
    PullRequest,
    RepoRef,
    Response,
    Subject,
    Unreachable,
    is_int_like,
    repo_halves,
)
from apps.worker.forges.github_app import GitHubApp

# The legacy `permission` field folds `maintain` into `write`; both spellings count.
WRITE_PERMISSIONS = {"admin", "maintain", "write"}
# Ruleset rules that stop a token from landing unreviewed work on the branch by itself.
PROTECTING_RULES = {"pull_request", "update"}
# What a job's App token may do: push the work, open its pull request, comment. Never `workflows`: a token
# without it cannot push a change under .github/workflows/.
JOB_PERMISSIONS = {"contents": "write", "pull_requests": "write", "issues": "write"}
# What an App's token on the fork organization needs to make a fork there (docs.github.com, "Create a fork": the
# Administration write and Contents read repository permissions), minted for that one request and revoked after.
FORK_PERMISSIONS = {"administration": "write", "contents": "read"}
# And to push the job's branch to the fork: its one repository, contents only (no workflows: as a job's token).
FORK_PUSH_PERMISSIONS = {"contents": "write"}


class GitHubClient(ForgeClient):
    forge = "github"
    token_variables = ("GITHUB_TOKEN", "GH_TOKEN")
    url_variable = "GITHUB_API_URL"
    # "body is too long (maximum is 65536 characters)", GitHub's 422 for an issue/PR comment or a PR body.
    max_comment_chars = 65_536
    max_description_chars = 65_536
    # docs.github.com, "About large files on GitHub": files larger than 100 MiB are blocked.
    max_file_bytes = 100 * 1024 * 1024
    forks = True

    @classmethod
    def from_settings(cls, **common) -> GitHubClient:
        from apps.worker.forges import github_app_from_settings

        return cls(base_url=settings.GITHUB_API_URL, token=settings.GITHUB_TOKEN,
                   app=github_app_from_settings(common["timeout"]),
                   fork_organization=settings.GITHUB_FORK_ORGANIZATION, **common)

    def __init__(self, *, app: GitHubApp | None = None, fork_organization: str = "", **kwargs):
        super().__init__(**kwargs)
        self.app = app
        self.fork_organization = fork_organization.strip()

    def _auth_headers(self, token: str) -> dict[str, str]:
        return {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "Authorization": f"Bearer {token}",
            "User-Agent": "pidispatch",
        }

    # --- receiver ---

    def _lookup_authority(self, subject: Subject) -> Authority:
        """Write access of `subject.login` to `subject.repo`: a commenter, a reviewer, a pull request's author, a
        closer, or whoever opened an issue with a label rule's label on (never `author_association`)."""
        token = self.token
        if self.app is not None:
            if "/" not in subject.repo:
                return Authority.no("unaskable")
            # Repo-scoped and narrowed to metadata: the lookup token can read permissions and nothing else.
            token = self.app.installation_token(subject.repo, {"metadata": "read"}, reuse=True).token
        if not token:
            return Authority.unknown("no-token")
        return self._repository_permission("{base}/repos/{owner}/{name}/collaborators/{login}/permission", subject,
                                           WRITE_PERMISSIONS, token)

    def self_identity(self) -> Identity:
        if self.app is None:
            return super().self_identity()
        # An App acts as its bot account `<slug>[bot]`; `GET /users/<slug>[bot]` (public) has its numeric id.
        try:
            slug = self.app.app_slug()
            return self._numeric_user_identity(f"{self.base_url}/users/{quote(slug + '[bot]', safe='')}", "")
        except ForgeFailure as failure:
            raise IdentityUnavailable(failure.reason, determinate=not failure.transient) from None
        except Unreachable as error:
            raise IdentityUnavailable(error.reason, determinate=False) from None

    def _lookup_identity(self) -> Identity:
        return self._numeric_user_identity(f"{self.base_url}{self.identity_path}")

    def _headers(self, token: str | None = None) -> dict[str, str]:
        headers = super()._headers(token)
        if headers["Authorization"] == "Bearer ":  # public lookups go unauthenticated
            del headers["Authorization"]
        return headers

    # --- worker ---

    def job_credential(self, ref: RepoRef) -> Credential:
        if self.app is not None:
            repo_halves(ref)
            return self.app.installation_token(ref.repo, JOB_PERMISSIONS)
        return super().job_credential(ref)

    def comment_credential(self, ref: RepoRef) -> Credential:
        if self.app is not None:
            repo_halves(ref)
            return self.app.installation_token(ref.repo, reuse=True)
        return super().job_credential(ref)

    def release_credential(self, credential: Credential) -> None:
        if self.app is not None and credential.source == "app":
            self.app.revoke(credential.token)

    def _default_branch(self, ref: RepoRef, credential: Credential) -> BranchHead:
        owner, name = repo_halves(ref)
        repo_url = f"{self.base_url}/repos/{owner}/{name}"
        repository = self._answer(self._get(repo_url, credential.token))
        branch_name = repository.get("default_branch")
        if not isinstance(branch_name, str) or not branch_name:
            raise ForgeFailure("default-branch-missing", transient=False)
        branch, commit = self._branch(f"{repo_url}/branches/{quote(branch_name, safe='')}", credential)
        protected = branch.get("protected") is True or self._ruleset_protected(repo_url, branch_name, credential)
        return self._branch_head(branch_name, commit.get("sha"), protected, repository.get("clone_url"))

    def _ruleset_protected(self, repo_url: str, branch: str, credential: Credential) -> bool:
        """Repository rulesets protect a branch too; the classic `protected` flag does not show them.
        A server without the rules API (older Enterprise Server) answers 404: no rulesets."""
        response = self._get(f"{repo_url}/rules/branches/{quote(branch, safe='')}", credential.token)
        if response.status == 404:
            return False
        rules = self._answer(response, list)
        return any(isinstance(rule, dict) and rule.get("type") in PROTECTING_RULES for rule in rules)

    def _post_comment(self, ref: RepoRef, target_type: str, number: int, text: str,
                      credential: Credential) -> Response:
        # Pull requests are issues for comments: one endpoint for both.
        owner, name = repo_halves(ref)
        return self._send("POST", f"{self.base_url}/repos/{owner}/{name}/issues/{number}/comments", {"body": text},
                          credential.token)

    # --- pull requests ---

    def _pulls_url(self, ref: RepoRef) -> str:
        owner, name = repo_halves(ref)
        return f"{self.base_url}/repos/{owner}/{name}/pulls"

    def _pull_head(self, ref: RepoRef, number: int, credential: Credential) -> PullHead:
        pull = self._pull(self._get(f"{self._pulls_url(ref)}/{number}", credential.token))
        return self._shared_shape_head(pull, number, _same_repository)

    def _find_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str,
                           credential: Credential) -> PullRequest | None:
        owner, _ = repo_halves(ref)
        return self._open_from(ref, f"{owner}:{head_branch}", head_branch, base_branch, credential, _same_repository)

    def _open_from(self, ref: RepoRef, head: str, head_branch: str, base_branch: str, credential: Credential,
                   same_repository) -> PullRequest | None:
        """The oldest open pull request whose `head` is `owner:branch` (this repository's, or a fork's: it has its
        owner's name) into `base_branch`, its head repository accepted by `same_repository`."""
        query = urlencode({"state": "open", "head": head, "base": base_branch, "per_page": 100})
        pulls = self._answer(self._get(f"{self._pulls_url(ref)}?{query}", credential.token), list)
        return self._oldest(ref, self._shared_shape_open(pulls, head_branch, base_branch, same_repository), "number")

    def _open_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str, title: str, body: str,
                           draft: bool, issue_number: int | None, credential: Credential) -> Response:
        return self._send("POST", self._pulls_url(ref), {"title": title, "head": head_branch, "base": base_branch,
                                                          "body": body, "draft": draft}, credential.token)

    def _opened(self, ref: RepoRef, data: dict) -> PullRequest:
        return self._pull_request_of(ref, data.get("number"))

    # --- the deployment's fork ---

    def _fork(self, ref: RepoRef, credential: Credential) -> Fork:
        """The fork in GITHUB_FORK_ORGANIZATION, else (a personal access token) in the token's own account. An App
        forks only into an organization it is installed on: its job token covers the one repository, so the fork is
        made with a token of the App's installation there, minted for it and revoked after."""
        if self.app is None:
            return self._shared_shape_fork(self.base_url, ref, credential, self.fork_organization)
        if not self.fork_organization:
            raise ForgeFailure("fork-unavailable", transient=False)
        installation = self.app.organization_installation(self.fork_organization)
        token = self.app.installation_token("", FORK_PERMISSIONS, installation_id=installation)
        try:
            return self._shared_shape_fork(self.base_url, ref, token, self.fork_organization)
        finally:
            self.app.revoke(token.token)

    def fork_credential(self, fork: Fork, credential: Credential) -> Credential:
        if self.app is None:
            return credential
        installation = self.app.organization_installation(self.fork_organization)
        return self.app.installation_token(fork.repo, FORK_PUSH_PERMISSIONS, installation_id=installation)

    def _fork_head(self, fork: Fork, head_branch: str) -> str:
        return self._owner_head(fork, head_branch)

    def _find_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str,
                                credential: Credential) -> PullRequest | None:
        return self._open_from(ref, self._owner_head(fork, head_branch), head_branch, base_branch, credential,
                               self._from_fork(fork))

    def _already_exists(self, response: Response) -> bool:
        # 422 {"message": "Validation Failed", "errors": [{"code": "custom", "message": "A pull request already
        # exists for owner:branch."}]}
        if response.status != 422 or not isinstance(response.data, dict):
            return False
        messages = [error.get("message") for error in response.data.get("errors") or [] if isinstance(error, dict)]
        return any(isinstance(message, str) and message.startswith("A pull request already exists")
                   for message in [*messages, response.data.get("message")])


def _same_repository(head: dict, base: dict) -> bool:
    """The head branch is in the base repository. A fork's repository that was deleted is `null`."""
    head_repo, base_repo = head.get("repo"), base.get("repo")
    if not isinstance(head_repo, dict) or not isinstance(base_repo, dict):
        return False
    if is_int_like(head_repo.get("id")) and is_int_like(base_repo.get("id")):
        return head_repo["id"] == base_repo["id"]
    names = [repo.get("full_name") for repo in (head_repo, base_repo)]
    return all(isinstance(name, str) and name for name in names) and names[0].lower() == names[1].lower()
