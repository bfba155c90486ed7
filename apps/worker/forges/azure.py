"""Azure DevOps: is the actor a member of the project, who our own token belongs to, the default branch
and its branch policies, status comments (work item comments, pull request threads), and pull requests (a
head, finding and opening one, Git Pull Requests API 7.1). A job acts with AZURE_TOKEN (a PAT). Its fork lives in
the deployment's own project (AZURE_FORK_PROJECT): forks stay in the organisation, and a project of its own keeps
the origin project's pipelines, service connections and variable groups away from the agent's branch.

Membership is answered by the Graph API on `vssps`: the actor's subject descriptor, the groups it belongs
to (walked upwards a few levels, so membership through an Entra/AAD group counts), and which of the
project's groups may start paid work: Project Administrators, Contributors and Build Administrators, an
allow list (Readers, Project Valid Users and any custom group do not count: reading a project is not a
licence to start paid work).
"""

from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import quote, urlencode, urlsplit

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
    TTLCache,
    fork_refused,
    is_int_like,
    part,
    retry_after,
)

API_VERSION = "7.1-preview.1"
GIT_API_VERSION = "7.1"
WORK_ITEM_COMMENTS_API_VERSION = "7.1-preview.4"
GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
MAX_PAGES = 20  # an email actor is looked up by listing users; a larger directory is "could not tell"
MAX_MEMBERSHIP_REQUESTS = 8  # bounds the upward walk through nested groups (a deeper member is refused)
PROJECT_GROUPS_SECONDS = 600
# Groups are told apart by descriptor (`vssgp.` + base64 of the group's SID), which neither a rename nor the
# server's language changes. Project Administrators is the project's namespace-administrators group: its SID
# is the project's domain followed by the well-known `0-0-0-0-1` in every project (Azure DevOps finds the
# group that way itself). Contributors and Build Administrators have no well-known SID: the process template
# creates them with a random one per project, so their descriptors are learned from the project's group list
# by the account name the template gave them (`[<project>]\Contributors`); a server whose templates are
# localised names its own (AZURE_WRITER_GROUPS). Nothing else counts, whatever it is called.
PROJECT_ADMINISTRATORS_SID = re.compile(r"^S-1-9-1551374245(?:-\d+){4}-0-0-0-0-1$")
WRITER_GROUPS = ("Contributors", "Build Administrators")
# A create refused because an active pull request joins the same two branches (409).
PULL_REQUEST_EXISTS = ("TF401179", "GitPullRequestExistsException")
# A create refused because the project has a repository of that name (409; the deployment's fork, made before).
REPOSITORY_EXISTS = ("TF400948", "GitRepositoryNameAlreadyExistsException")


def group_sid(descriptor: str) -> str:
    """The SID inside a `vssgp.` group descriptor ("" for any other descriptor)."""
    kind, _, encoded = descriptor.partition(".")
    if kind != "vssgp" or not encoded:
        return ""
    try:
        decoded = base64.b64decode(encoded.replace("-", "+").replace("_", "/") + "=" * (-len(encoded) % 4),
                                   validate=True)
    except (binascii.Error, ValueError):
        return ""
    return decoded.decode("ascii", "replace")


def account_name(group: dict) -> str:
    """`Contributors` of a principal name `[<project>]\\Contributors`."""
    return str(group.get("principalName") or "").rpartition("\\")[2]


def graph_url_for(org_url: str) -> str:
    """`https://dev.azure.com/<org>` -> `https://vssps.dev.azure.com/<org>` (and the visualstudio.com form)."""
    parts = urlsplit(org_url.rstrip("/"))
    host = parts.hostname or ""
    if host == "dev.azure.com":
        return f"{parts.scheme}://vssps.dev.azure.com{parts.path}"
    if host.endswith(".visualstudio.com") and ".vssps." not in host:
        org = host.split(".", 1)[0]
        return f"{parts.scheme}://{org}.vssps.visualstudio.com{parts.path}"
    return org_url.rstrip("/")  # Azure DevOps Server serves Graph on the collection URL itself


class _Undetermined(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        self.reason = reason
        self.retry_after = retry_after


class AzureClient(ForgeClient):
    forge = "azure"
    project_groups_cache = TTLCache(max_entries=128)
    token_variables = ("AZURE_DEVOPS_EXT_PAT",)  # the az devops CLI's name
    url_variable = "SYSTEM_COLLECTIONURI"  # the organisation URL, as Azure Pipelines names it
    git_user = ""  # a PAT goes with an empty user name
    identity_path = "/_apis/connectionData"
    # Pull request thread comments: 150,000 characters (not confirmed in Microsoft's docs; work item comments,
    # a long-text field, take 1M, learn.microsoft.com ".../settings/work/object-limits").
    max_comment_chars = 150_000
    # A pull request's description takes at most 4,000 characters (a longer one is refused, 400).
    max_description_chars = 4_000
    # learn.microsoft.com "Git limits" (azure/devops/repos/git/limits): files should be 100 MB or less;
    # conservative, decimal megabytes.
    max_file_bytes = 100_000_000

    @classmethod
    def from_settings(cls, **common) -> AzureClient:
        return cls(base_url=settings.AZURE_ORG_URL, token=settings.AZURE_TOKEN, graph_url=settings.AZURE_GRAPH_URL,
                   writer_groups=settings.AZURE_WRITER_GROUPS, fork_project=settings.AZURE_FORK_PROJECT, **common)

    def __init__(self, *, base_url: str, token: str, graph_url: str = "", writer_groups=WRITER_GROUPS,
                 fork_project: str = "", **kwargs):
        super().__init__(base_url=base_url, token=token, **kwargs)
        self.graph_url = (graph_url or graph_url_for(base_url)).rstrip("/")
        self.writer_groups = frozenset(name.casefold() for name in writer_groups)
        self.fork_project = fork_project.strip()

    @property
    def forks(self) -> bool:
        return bool(self.fork_project)

    def _auth_headers(self, token: str) -> dict[str, str]:
        credential = base64.b64encode(f":{token}".encode()).decode()
        return {"Authorization": f"Basic {credential}", "User-Agent": "pidispatch"}

    def _graph(self, path: str, **params) -> tuple[dict, dict]:
        query = urlencode({**params, "api-version": API_VERSION})
        response = self._get(f"{self.graph_url}/_apis/graph/{path}?{query}")
        if response.status == 404:
            raise LookupError
        if response.status != 200:
            raise _Undetermined(f"status-{response.status}", retry_after(response))
        if not isinstance(response.data, dict):
            raise _Undetermined("malformed-answer")
        return response.data, response.headers

    def _descriptor(self, storage_key: str) -> str:
        data, _ = self._graph(f"descriptors/{quote(storage_key, safe='')}")
        value = data.get("value")
        if not isinstance(value, str) or not value:
            raise _Undetermined("malformed-answer")
        return value

    def _pages(self, path: str, **params):
        """The entries of a paged Graph listing; more pages than MAX_PAGES is "could not tell"."""
        token = None
        for _ in range(MAX_PAGES):
            data, headers = self._graph(path, **params, **({"continuationToken": token} if token else {}))
            yield from (entry for entry in data.get("value") or [] if isinstance(entry, dict))
            token = headers.get("x-ms-continuationtoken")
            if not token:
                return
        raise _Undetermined("listing-too-large")

    def _user_descriptor_by_email(self, email: str) -> str | None:
        for user in self._pages("users", subjectTypes="aad,msa"):
            names = {str(user.get(key) or "").casefold() for key in ("principalName", "mailAddress")}
            if email.casefold() in names and isinstance(user.get("descriptor"), str):
                return user["descriptor"]
        return None  # the whole directory was listed: a determinate "not found"

    def _may_start_work(self, group: dict) -> bool:
        descriptor = group.get("descriptor")
        if not isinstance(descriptor, str):
            return False
        if PROJECT_ADMINISTRATORS_SID.fullmatch(group_sid(descriptor)):
            return True
        return account_name(group).casefold() in self.writer_groups

    def _project_groups(self, project_descriptor: str) -> set[str]:
        """The descriptors of the project's groups whose members may start work."""
        key = (self.graph_url, project_descriptor, self.writer_groups)
        cached = self.project_groups_cache.get(key)
        if cached is not None:
            return cached
        groups = {group["descriptor"] for group in self._pages("groups", scopeDescriptor=project_descriptor)
                  if self._may_start_work(group)}
        self.project_groups_cache.put(key, groups, PROJECT_GROUPS_SECONDS)
        return groups

    def _containers(self, descriptor: str) -> list[str]:
        data, _ = self._graph(f"memberships/{quote(descriptor, safe='')}", direction="up")
        return [
            entry["containerDescriptor"] for entry in data.get("value") or []
            if isinstance(entry, dict) and isinstance(entry.get("containerDescriptor"), str)
        ]

    def _lookup_authority(self, subject: Subject) -> Authority:
        if not GUID.fullmatch(subject.project_id or ""):
            return Authority.no("unaskable")
        if not GUID.fullmatch(subject.actor_id or "") and "@" not in (subject.email or ""):
            return Authority.no("unaskable")
        try:
            if GUID.fullmatch(subject.actor_id or ""):
                actor = self._descriptor(subject.actor_id)
            else:
                actor = self._user_descriptor_by_email(subject.email)
                if actor is None:
                    return Authority.no("not-in-directory")
            project_groups = self._project_groups(self._descriptor(subject.project_id))
            return self._walk_up(actor, project_groups)
        except LookupError:
            return Authority.no("not-found")
        except _Undetermined as undetermined:
            return Authority.unknown(undetermined.reason, undetermined.retry_after)

    def _walk_up(self, actor: str, project_groups: set[str]) -> Authority:
        seen, frontier, requests = {actor}, [actor], 0
        while frontier:
            descriptor = frontier.pop(0)
            if requests >= MAX_MEMBERSHIP_REQUESTS:
                # Asking again would walk the same groups: a bounded "no", not a retry loop.
                return Authority.no("not-member-within-walk")
            requests += 1
            for container in self._containers(descriptor):
                if container in project_groups:
                    return Authority.yes("project-member")
                if container not in seen:
                    seen.add(container)
                    frontier.append(container)
        return Authority.no("not-member")

    def _lookup_identity(self) -> Identity:
        response = self._get(f"{self.base_url}{self.identity_path}")
        if response.status != 200:
            raise self.identity_failure(response)
        user = response.data.get("authenticatedUser") if isinstance(response.data, dict) else None
        user_id = user.get("id") if isinstance(user, dict) else None
        if not isinstance(user_id, str) or not GUID.fullmatch(user_id):
            raise IdentityUnavailable("malformed-answer", determinate=False)
        account = ((user.get("properties") or {}).get("Account") or {}).get("$value")
        email = account.strip().lower() if isinstance(account, str) and "@" in account else ""
        return Identity(id=user_id.lower(), email=email)

    # --- worker ---

    @staticmethod
    def _project_and_repository(ref: RepoRef) -> tuple[str, str]:
        """Ids when the delivery had them, else the names from `project/repo`."""
        project, _, repository = ref.repo.partition("/")
        project, repository = ref.project_id or project, ref.repository_id or repository
        if not project or not repository or "/" in repository:
            raise ForgeFailure("forge-repo-not-found", transient=False)
        return project, repository

    def _project_url(self, ref: RepoRef) -> str:
        return f"{self.base_url}/{quote(self._project_and_repository(ref)[0], safe='')}"

    def _repository_url(self, ref: RepoRef) -> str:
        repository = self._project_and_repository(ref)[1]
        return f"{self._project_url(ref)}/_apis/git/repositories/{quote(repository, safe='')}"

    def _default_branch(self, ref: RepoRef, credential: Credential) -> BranchHead:
        repository = self._answer(self._get(f"{self._repository_url(ref)}?api-version={GIT_API_VERSION}",
                                            credential.token))
        ref_name = repository.get("defaultBranch")
        repository_id = repository.get("id")
        if not isinstance(ref_name, str) or not ref_name.startswith("refs/heads/"):
            raise ForgeFailure("default-branch-missing", transient=False)  # an empty repository has none
        if not isinstance(repository_id, str) or not GUID.fullmatch(repository_id):
            raise ForgeFailure("forge-malformed-answer", transient=True)
        project_url = self._project_url(ref)
        branch = ref_name[len("refs/heads/"):]
        refs = self._answer(self._get(
            f"{project_url}/_apis/git/repositories/{repository_id}/refs?"
            + urlencode({"filter": f"heads/{branch}", "api-version": GIT_API_VERSION}), credential.token))
        # `filter` is a prefix match: `heads/main` also lists `heads/main-old`.
        sha = next((entry.get("objectId") for entry in refs.get("value") or []
                    if isinstance(entry, dict) and entry.get("name") == ref_name), None)
        if sha is None:
            raise ForgeFailure("default-branch-missing", transient=False)
        return self._branch_head(branch, sha, self._has_blocking_policy(project_url, repository_id, ref_name,
                                                                          credential),
                                 repository.get("remoteUrl"))

    def _has_blocking_policy(self, project_url: str, repository_id: str, ref_name: str,
                             credential: Credential) -> bool:
        """Any enabled, blocking branch policy (reviewers, builds, ...) makes Azure refuse direct pushes:
        that is what a protected default branch means here."""
        policies = self._answer(self._get(
            f"{project_url}/_apis/git/policy/configurations?"
            + urlencode({"repositoryId": repository_id, "refName": ref_name, "api-version": GIT_API_VERSION}),
            credential.token))
        return any(
            isinstance(policy, dict) and policy.get("isEnabled") is True and policy.get("isBlocking") is True
            and policy.get("isDeleted") is not True
            for policy in policies.get("value") or []
        )

    def _post_comment(self, ref: RepoRef, target_type: str, number: int, text: str,
                      credential: Credential) -> Response:
        if target_type == "pull_request":
            return self._send(
                "POST", f"{self._repository_url(ref)}/pullRequests/{number}/threads?api-version={GIT_API_VERSION}",
                {"comments": [{"parentCommentId": 0, "content": text, "commentType": 1}], "status": "active"},
                credential.token)
        url = f"{self._project_url(ref)}/_apis/wit/workItems/{number}/comments"
        return self._send("POST", f"{url}?api-version={WORK_ITEM_COMMENTS_API_VERSION}", {"text": text},
                          credential.token)

    # --- pull requests ---

    def _pull_head(self, ref: RepoRef, number: int, credential: Credential) -> PullHead:
        pull = self._pull(self._get(f"{self._repository_url(ref)}/pullrequests/{number}?api-version={GIT_API_VERSION}",
                                    credential.token))
        source = pull.get("sourceRefName")
        branch = source[len("refs/heads/"):] if isinstance(source, str) and source.startswith("refs/heads/") else None
        commit = pull.get("lastMergeSourceCommit")
        same = pull.get("forkSource") is None
        # A fork's branch is not in this repository; Azure keeps the pull request's merge there.
        fetch_ref = f"refs/heads/{branch}" if same else f"refs/pull/{number}/merge"
        return self._pull_head_of(pull.get("pullRequestId"), asked=number,
                                  sha=commit.get("commitId") if isinstance(commit, dict) else None, branch=branch,
                                  same_repository=same, fetch_ref=fetch_ref, open=pull.get("status") == "active")

    def _find_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str,
                           credential: Credential) -> PullRequest | None:
        source, target = f"refs/heads/{head_branch}", f"refs/heads/{base_branch}"
        query = urlencode({"searchCriteria.sourceRefName": source, "searchCriteria.targetRefName": target,
                           "searchCriteria.status": "active", "$top": 100, "api-version": GIT_API_VERSION})
        pulls = self._answer(self._get(f"{self._repository_url(ref)}/pullrequests?{query}", credential.token))
        found = [pull for pull in pulls.get("value") or [] if isinstance(pull, dict) and pull.get("status") == "active"
                 and pull.get("sourceRefName") == source and pull.get("targetRefName") == target
                 and pull.get("forkSource") is None and is_int_like(pull.get("pullRequestId"))]
        return self._opened(ref, min(found, key=lambda pull: pull["pullRequestId"])) if found else None

    def _open_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str, title: str, body: str,
                           draft: bool, issue_number: int | None, credential: Credential) -> Response:
        pull = {"sourceRefName": f"refs/heads/{head_branch}", "targetRefName": f"refs/heads/{base_branch}",
                "title": title, "description": body, "isDraft": draft}
        if issue_number is not None:
            pull["workItemRefs"] = [{"id": str(issue_number)}]
        return self._send("POST", f"{self._repository_url(ref)}/pullrequests?api-version={GIT_API_VERSION}", pull,
                          credential.token)

    def _open_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str, title: str,
                                body: str, draft: bool, issue_number: int | None, credential: Credential) -> Response:
        """Created on this repository (the target), its `forkSource` the fork."""
        pull = {"sourceRefName": f"refs/heads/{head_branch}", "targetRefName": f"refs/heads/{base_branch}",
                "title": title, "description": body, "isDraft": draft,
                "forkSource": {"repository": {"id": fork.project_id}}}
        if issue_number is not None:
            pull["workItemRefs"] = [{"id": str(issue_number)}]
        return self._send("POST", f"{self._repository_url(ref)}/pullrequests?api-version={GIT_API_VERSION}", pull,
                          credential.token)

    def _find_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str,
                                credential: Credential) -> PullRequest | None:
        source, target = f"refs/heads/{head_branch}", f"refs/heads/{base_branch}"
        query = urlencode({"searchCriteria.sourceRefName": source, "searchCriteria.targetRefName": target,
                           "searchCriteria.sourceRepositoryId": fork.project_id, "searchCriteria.status": "active",
                           "$top": 100, "api-version": GIT_API_VERSION})
        pulls = self._answer(self._get(f"{self._repository_url(ref)}/pullrequests?{query}", credential.token))
        found = [pull for pull in pulls.get("value") or [] if isinstance(pull, dict) and pull.get("status") == "active"
                 and pull.get("sourceRefName") == source and pull.get("targetRefName") == target
                 and str(part(part(pull, "forkSource"), "repository").get("id") or "").lower() == fork.project_id
                 and is_int_like(pull.get("pullRequestId"))]
        return self._opened(ref, min(found, key=lambda pull: pull["pullRequestId"])) if found else None

    # --- the deployment's fork ---

    def _fork(self, ref: RepoRef, credential: Credential) -> Fork:
        """The fork in AZURE_FORK_PROJECT, named as the repository: POST .../_apis/git/repositories with the origin
        as its `parentRepository`; a second create answers 409 (TF400948), and the fork is then read by name. A
        repository of that name that is not this one's fork is refused, never pushed to."""
        origin = self._answer(self._get(f"{self._repository_url(ref)}?api-version={GIT_API_VERSION}",
                                        credential.token))
        origin_id, name = str(origin.get("id") or ""), origin.get("name")
        origin_project = part(origin, "project").get("id")
        if not GUID.fullmatch(origin_id) or not isinstance(name, str) or not name \
                or not isinstance(origin_project, str):
            raise ForgeFailure("forge-malformed-answer", transient=True)
        target = {"id" if GUID.fullmatch(self.fork_project) else "name": self.fork_project}
        repositories = f"{self.base_url}/{quote(self.fork_project, safe='')}/_apis/git/repositories"
        response = self._send("POST", f"{repositories}?api-version={GIT_API_VERSION}", {
            "name": name, "project": target,
            "parentRepository": {"id": origin_id, "project": {"id": origin_project}}}, credential.token)
        if response.status == 409 and self._says(response, REPOSITORY_EXISTS):
            data = self._answer(self._get(f"{repositories}/{quote(name, safe='')}?api-version={GIT_API_VERSION}",
                                          credential.token))
        elif response.status in (200, 201):
            data = response.data if isinstance(response.data, dict) else {}
        else:
            raise fork_refused(response)
        fork_id = str(data.get("id") or "").lower()
        project_name = part(data, "project").get("name")
        if data.get("isFork") is not True or not GUID.fullmatch(fork_id) or fork_id == origin_id.lower() \
                or str(part(data, "parentRepository").get("id") or "").lower() != origin_id.lower() \
                or not isinstance(project_name, str) or not project_name:
            raise ForgeFailure("fork-unavailable", transient=False)  # what answered is not a fork of this one
        return Fork(repo=f"{project_name}/{data.get('name') or name}",
                    clone_url=self.own_clone_url(data.get("remoteUrl")), project_id=fork_id)

    @staticmethod
    def _says(response: Response, markers: tuple[str, ...]) -> bool:
        """Does an error answer carry one of `markers` (its TF code or its exception's type key)?"""
        data = response.data if isinstance(response.data, dict) else {}
        said = f"{data.get('message')} {data.get('typeKey')}"
        return any(marker in said for marker in markers)

    def _opened(self, ref: RepoRef, data: dict) -> PullRequest:
        """The pull request and its web page (its `url` is the API's), by the names the answer gives."""
        repository = data.get("repository") if isinstance(data.get("repository"), dict) else {}
        project = repository.get("project") if isinstance(repository.get("project"), dict) else {}
        names = project.get("name"), repository.get("name")
        if not all(isinstance(name, str) and name for name in names):
            return self._pull_request_of(ref, data.get("pullRequestId"))
        return self._pull_request_of(RepoRef(f"{names[0]}/{names[1]}"), data.get("pullRequestId"))

    def _already_exists(self, response: Response) -> bool:
        # 409 {"message": "TF401179: An active pull request for the source and target branch already exists.",
        #      "typeKey": "GitPullRequestExistsException", ...}
        return response.status in (400, 409) and self._says(response, PULL_REQUEST_EXISTS)

    def _issue_link(self, issue_number: int) -> str:
        return ""  # the work item is linked by the create call's workItemRefs
