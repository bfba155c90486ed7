"""Pull/merge requests on every forge (apps/worker/forges): a pull request's head, finding the open one from a
branch, opening one (draft, issue link, the "already exists" answer), and how failures are classified, over
real HTTP against the stateful stand-in (devtools/fake_forge.py) answering in each forge's documented shapes."""

from dataclasses import dataclass

import pytest

from apps.worker.forges import Credential, ForgeFailure, PullHead, PullRequest, RepoRef
from apps.worker.forges import forgejo as forgejo_module
from apps.worker.forges.azure import AzureClient
from apps.worker.forges.base import ForgeClient
from apps.worker.forges.forgejo import ForgejoClient
from apps.worker.forges.github import GitHubClient
from apps.worker.forges.gitlab import GitLabClient
from tests.receiver_support import AZURE_PROJECT_ID, git, make_repository

MAIN_SHA = "1" * 40
HEAD_SHA = "ABCDEF0123456789ABCDEF0123456789ABCDEF01"  # the forge's case; a PullHead's is lowercased
REPOSITORY_ID = "3411ebc1-d5aa-464f-9615-0b527bc66719"
TOKEN = "forge-job-token"
CREDENTIAL = Credential(token=TOKEN)


@dataclass
class Forge:
    name: str
    server: object
    client: ForgeClient
    ref: RepoRef
    key: str  # the repository as the stand-in's pull request records name it
    api: str  # the path the pull requests live under

    def add(self, **fields) -> dict:
        return self.server.add_pull_request(self.name, self.key, **fields)

    def posted(self) -> list[dict]:
        return self.server.posted(self.api)

    def calls(self, method: str = "GET") -> list[dict]:
        return [r for r in self.server.requests if r["method"] == method and r["path"].startswith(self.api)]


def setup(name: str, server, **client_options) -> Forge:
    common = {"base_url": server.url, "token": "unused-config-token", "timeout": 2, **client_options}
    if name == "github":
        server.github_repository("acme/web", MAIN_SHA)
        return Forge(name, server, GitHubClient(**common), RepoRef("acme/web"), "acme/web", "/repos/acme/web/pulls")
    if name == "gitlab":
        server.gitlab_project(42, "group/proj", MAIN_SHA)
        return Forge(name, server, GitLabClient(**common), RepoRef("group/proj", project_id="42"), "42",
                     "/api/v4/projects/42/merge_requests")
    if name == "forgejo":
        server.forgejo_repository("kostekIV/test", MAIN_SHA)
        return Forge(name, server, ForgejoClient(**common), RepoRef("kostekIV/test"), "kostekIV/test",
                     "/api/v1/repos/kostekIV/test/pulls")
    server.azure_repository(AZURE_PROJECT_ID, REPOSITORY_ID, "web", MAIN_SHA)
    return Forge(name, server, AzureClient(**common, graph_url=server.url),
                 RepoRef("Fabrikam/web", project_id=AZURE_PROJECT_ID, repository_id=REPOSITORY_ID), REPOSITORY_ID,
                 f"/{AZURE_PROJECT_ID}/_apis/git/repositories/{REPOSITORY_ID}/pullrequests")


FORGES = ["github", "gitlab", "forgejo", "azure"]
FETCH_REFS = {"github": "refs/pull/12/head", "gitlab": "refs/merge-requests/12/head", "forgejo": "refs/pull/12/head",
              "azure": "refs/heads/feature/login"}
# Built from the web root the client knows the forge by (here the stand-in's own URL), never from the address the
# answer names (the stand-in answers github.com's and gitlab.example.com's, as a proxy or a stale host would).
WEB_PAGES = {"github": "{url}/acme/web/pull/{n}", "gitlab": "{url}/group/proj/-/merge_requests/{n}",
             "forgejo": "{url}/kostekIV/test/pulls/{n}", "azure": "{url}/Fabrikam/_git/web/pullrequest/{n}"}
AUTHORIZATION = {"github": ("authorization", f"Bearer {TOKEN}"), "gitlab": ("private-token", TOKEN),
                 "forgejo": ("authorization", f"token {TOKEN}"),
                 "azure": ("authorization", "Basic OmZvcmdlLWpvYi10b2tlbg==")}  # base64(":forge-job-token")


@pytest.fixture(params=FORGES)
def forge(request, fake_forge):
    return setup(request.param, fake_forge)


def page(forge: Forge, number: int) -> str:
    return WEB_PAGES[forge.name].format(url=forge.server.url, n=number)


def refused(call, *args, **kwargs) -> ForgeFailure:
    with pytest.raises(ForgeFailure) as failure:
        call(*args, **kwargs)
    return failure.value


def open_pull(forge: Forge, **overrides) -> PullRequest:
    arguments = {"head_branch": "pi/issue-7", "base_branch": "main", "title": "Fix the login page",
                 "body": "What the agent did.", "draft": True, "issue_number": 7, "credential": CREDENTIAL,
                 **overrides}
    return forge.client.open_pull_request(forge.ref, **arguments)


# --- a pull request's head ---------------------------------------------------------------------------------------

def test_the_head_of_a_same_repository_pull_request(forge):
    forge.add(number=12, head="feature/login", sha=HEAD_SHA)

    head = forge.client.pull_head(forge.ref, 12, CREDENTIAL)

    assert head == PullHead(number=12, sha=HEAD_SHA.lower(), branch="feature/login", same_repository=True,
                            fetch_ref=FETCH_REFS[forge.name], open=True)
    (request,) = forge.calls()
    assert request["path"] == f"{forge.api}/12"
    header, value = AUTHORIZATION[forge.name]
    assert request["headers"][header] == value  # the job's credential, not the configured token
    if forge.name == "azure":
        assert request["query"]["api-version"] == ["7.1"]


def test_the_head_of_a_forks_pull_request_is_fetched_from_the_base_repository(forge):
    forge.add(number=12, head="feature/login", sha=HEAD_SHA, fork="someone/web-fork")

    head = forge.client.pull_head(forge.ref, 12, CREDENTIAL)

    assert (head.same_repository, head.branch, head.sha, head.open) == (False, "feature/login", HEAD_SHA.lower(), True)
    # The fork's branch is not in this repository: Azure keeps the merge of a fork's pull request instead.
    assert head.fetch_ref == ("refs/pull/12/merge" if forge.name == "azure" else FETCH_REFS[forge.name])


@pytest.mark.parametrize("state", ["closed", "merged"])
def test_a_closed_or_merged_pull_request_is_not_open(forge, state):
    forge.add(number=12, head="feature/login", sha=HEAD_SHA, state=state)
    assert forge.client.pull_head(forge.ref, 12, CREDENTIAL).open is False


def test_a_pull_request_that_is_not_there(forge):
    failure = refused(forge.client.pull_head, forge.ref, 12, CREDENTIAL)
    assert (failure.reason, failure.transient) == ("pull-request-missing", False)


@pytest.mark.parametrize("sha, branch", [("not-a-commit", "feature/login"), ("abc123", "feature/login"),
                                         (HEAD_SHA, "--upload-pack=evil"), (HEAD_SHA, "a..b")])
def test_a_head_the_forge_cannot_have_meant_is_a_malformed_answer(forge, sha, branch):
    forge.add(number=12, head=branch, sha=sha)
    failure = refused(forge.client.pull_head, forge.ref, 12, CREDENTIAL)
    assert (failure.reason, failure.transient) == ("forge-malformed-answer", True)


def test_a_number_that_cannot_be_a_pull_request_is_refused_without_a_request(forge):
    for number in (0, -1, "12", True):
        assert refused(forge.client.pull_head, forge.ref, number, CREDENTIAL).reason == "pull-request-missing"
    assert forge.server.requests == []


# --- finding the open one ----------------------------------------------------------------------------------------

def test_find_none(forge):
    assert forge.client.find_pull_request(forge.ref, "pi/issue-7", "main", CREDENTIAL) is None
    (request,) = forge.calls()
    query = request["query"]
    if forge.name == "github":
        assert (query["state"], query["head"], query["base"]) == (["open"], ["acme:pi/issue-7"], ["main"])
    elif forge.name == "gitlab":  # GitLab lists every state unless told
        assert (query["state"], query["source_branch"], query["target_branch"]) == (["opened"], ["pi/issue-7"],
                                                                                    ["main"])
    elif forge.name == "forgejo":  # no head/base filter: the open ones, most recently updated first
        assert (query["state"], query["sort"]) == (["open"], ["recentupdate"])
    else:
        assert (query["searchCriteria.sourceRefName"], query["searchCriteria.targetRefName"],
                query["searchCriteria.status"]) == (["refs/heads/pi/issue-7"], ["refs/heads/main"], ["active"])


def test_find_the_open_one_among_others(forge):
    forge.add(head="pi/issue-7", sha=HEAD_SHA, state="closed")  # an earlier attempt, closed
    forge.add(head="pi/issue-7", sha=HEAD_SHA, base="release")  # the same branch into another base
    forge.add(head="pi/issue-7", sha=HEAD_SHA, fork="someone/web-fork")  # a fork's branch of the same name
    forge.add(head="pi/issue-8", sha=HEAD_SHA)
    mine = forge.add(head="pi/issue-7", sha=HEAD_SHA)

    found = forge.client.find_pull_request(forge.ref, "pi/issue-7", "main", CREDENTIAL)

    assert found == PullRequest(number=mine["number"], url=page(forge, mine["number"]))


def test_find_does_not_return_a_closed_one(forge):
    forge.add(head="pi/issue-7", sha=HEAD_SHA, state="closed")
    forge.add(head="pi/issue-7", sha=HEAD_SHA, state="merged")
    assert forge.client.find_pull_request(forge.ref, "pi/issue-7", "main", CREDENTIAL) is None


def test_find_does_not_return_a_forks_pull_request_from_a_branch_of_the_same_name(forge):
    forge.add(head="pi/issue-7", sha=HEAD_SHA, fork="someone/web-fork")
    assert forge.client.find_pull_request(forge.ref, "pi/issue-7", "main", CREDENTIAL) is None


def test_forgejo_reads_the_open_pull_requests_a_page_at_a_time(fake_forge):
    forge = setup("forgejo", fake_forge)
    mine = forge.add(head="pi/issue-7", sha=HEAD_SHA)  # the oldest: on the last page, most recently updated first
    for number in range(60):
        forge.add(head=f"other-{number}", sha=HEAD_SHA)

    found = forge.client.find_pull_request(forge.ref, "pi/issue-7", "main", CREDENTIAL)

    assert found is not None and found.number == mine["number"]
    assert [r["query"]["page"] for r in forge.calls()] == [["1"], ["2"]]


def test_forgejo_refuses_rather_than_answer_none_past_its_page_bound(fake_forge, monkeypatch):
    forge = setup("forgejo", fake_forge)
    monkeypatch.setattr(forgejo_module, "MAX_PAGES", 1)
    for number in range(60):
        forge.add(head=f"other-{number}", sha=HEAD_SHA)

    failure = refused(forge.client.find_pull_request, forge.ref, "pi/issue-7", "main", CREDENTIAL)

    assert (failure.reason, failure.transient) == ("forge-listing-too-large", False)


# --- opening one -------------------------------------------------------------------------------------------------

def test_open_a_draft_linked_to_its_issue(forge):
    opened = open_pull(forge)

    (record,) = forge.server.created_pull_requests
    assert opened == PullRequest(number=record["number"], url=page(forge, record["number"]))
    assert (record["head"], record["base"], record["draft"], record["issues"]) == ("pi/issue-7", "main", True, [7])
    (sent,) = forge.posted()
    if forge.name == "github":
        assert sent == {"title": "Fix the login page", "head": "pi/issue-7", "base": "main",
                        "body": "What the agent did.\n\nCloses #7", "draft": True}
    elif forge.name == "gitlab":  # a draft is a title prefix; the create API has no draft attribute
        assert sent == {"source_branch": "pi/issue-7", "target_branch": "main", "title": "Draft: Fix the login page",
                        "description": "What the agent did.\n\nCloses #7"}
    elif forge.name == "forgejo":  # WORK_IN_PROGRESS_PREFIXES' default
        assert sent == {"head": "pi/issue-7", "base": "main", "title": "WIP: Fix the login page",
                        "body": "What the agent did.\n\nCloses #7"}
    else:  # the work item is linked by the call, not by the text
        assert sent == {"sourceRefName": "refs/heads/pi/issue-7", "targetRefName": "refs/heads/main",
                        "title": "Fix the login page", "description": "What the agent did.", "isDraft": True,
                        "workItemRefs": [{"id": "7"}]}
    header, value = AUTHORIZATION[forge.name]
    assert forge.calls("POST")[0]["headers"][header] == value


def test_open_a_ready_one_without_an_issue(forge):
    open_pull(forge, draft=False, issue_number=None, body="")

    (record,) = forge.server.created_pull_requests
    assert (record["title"], record["body"], record["draft"], record["issues"]) == ("Fix the login page", "", False, [])
    (sent,) = forge.posted()
    assert "workItemRefs" not in sent and sent.get("draft", False) is False and sent.get("isDraft", False) is False


def test_a_title_that_already_says_draft_is_not_prefixed_twice(fake_forge):
    forge = setup("gitlab", fake_forge)
    open_pull(forge, title="draft: my notes")
    assert forge.posted()[0]["title"] == "draft: my notes"


def test_the_already_exists_answer_is_the_existing_pull_request(forge):
    existing = forge.add(head="pi/issue-7", sha=HEAD_SHA)

    opened = open_pull(forge)

    assert opened == PullRequest(number=existing["number"], url=page(forge, existing["number"]))
    assert forge.server.created_pull_requests == []  # the stand-in refused the second one, as the forge does
    assert [r["method"] for r in forge.server.requests if r["path"].startswith(forge.api)][:2] == ["POST", "GET"]


def test_a_retried_publish_gets_the_one_the_first_attempt_opened(forge):
    first = open_pull(forge)
    again = open_pull(forge)
    assert again == first and len(forge.server.created_pull_requests) == 1


def test_already_exists_yet_none_open_is_a_conflict_to_retry(forge):
    # A create refused as a duplicate while the listing shows none: it was closed in between.
    duplicate = {"github": (422, {"message": "Validation Failed", "errors": [
                     {"resource": "PullRequest", "code": "custom",
                      "message": "A pull request already exists for acme:pi/issue-7."}]}),
                 "gitlab": (409, {"message": ["Another open merge request already exists for this source branch: !3"]}),
                 "forgejo": (409, {"message": "pull request already exists for these targets [id: 3]"}),
                 "azure": (409, {"message": "TF401179: An active pull request for the source and target branch "
                                            "already exists.", "typeKey": "GitPullRequestExistsException"})}
    forge.server.routes[("POST", forge.api)] = duplicate[forge.name]

    failure = refused(open_pull, forge)

    assert (failure.reason, failure.transient) == ("pull-request-conflict", True)


def test_a_description_longer_than_the_forge_takes_is_cut_and_keeps_its_issue_link(forge):
    limit = forge.client.max_description_chars
    open_pull(forge, body="x" * (limit + 500))  # the stand-in refuses an over-long one, as the forge does

    (record,) = forge.server.created_pull_requests
    assert len(record["body"]) <= limit and record["body"].startswith("xxx") and "cut to fit" in record["body"]
    assert record["issues"] == [7]


def test_a_title_longer_than_the_forge_takes_is_cut(forge):
    open_pull(forge, title="t" * 400)
    (record,) = forge.server.created_pull_requests
    assert len(record["title"]) == 255 and record["title"].endswith("…")


@pytest.mark.parametrize("arguments", [{"head_branch": "main"}, {"head_branch": "-x"}, {"base_branch": "a b"},
                                       {"title": "  "}, {"issue_number": 0}, {"issue_number": "7"}])
def test_requests_no_forge_could_take_are_refused_before_any_call(forge, arguments):
    failure = refused(open_pull, forge, **arguments)
    assert (failure.reason, failure.transient) == ("forge-request-refused", False)
    assert forge.server.requests == []


def test_a_refused_create_is_not_mistaken_for_a_duplicate(forge):
    forge.server.routes[("POST", forge.api)] = (422, {"message": "Validation Failed", "errors": [
        {"resource": "PullRequest", "field": "head", "code": "invalid"}]})
    failure = refused(open_pull, forge)
    assert (failure.reason, failure.transient) == ("forge-request-refused", False)
    assert forge.calls() == []  # nothing was looked up


# --- failures ----------------------------------------------------------------------------------------------------

CALLS = {
    "pull_head": lambda forge: forge.client.pull_head(forge.ref, 12, CREDENTIAL),
    "find": lambda forge: forge.client.find_pull_request(forge.ref, "pi/issue-7", "main", CREDENTIAL),
    "open": open_pull,
}


def answer_with(forge: Forge, call: str, answer) -> None:
    """Make the forge give `answer` to `call` (exact routes win over the stand-in's pull request routes)."""
    if call == "pull_head":
        forge.server.routes[f"{forge.api}/12"] = answer
    elif call == "find":
        forge.server.routes[forge.api] = answer
    else:
        forge.server.routes[("POST", forge.api)] = answer


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("status, reason, transient", [
    (401, "forge-auth-refused", False), (403, "forge-auth-refused", False), (404, "forge-repo-not-found", False),
    (500, "forge-unavailable", True), (502, "forge-unavailable", True), (503, "forge-unavailable", True),
    (429, "forge-rate-limited", True),
])
def test_failures_are_classified(forge, call, status, reason, transient):
    answer_with(forge, call, (status, {"message": "the forge's own words"}))
    if call == "pull_head" and status == 404:
        reason = "pull-request-missing"

    failure = refused(CALLS[call], forge)

    assert (failure.reason, failure.transient) == (reason, transient)
    assert "forge's own words" not in str(failure)  # an answer's body is never carried


@pytest.mark.parametrize("call", CALLS)
def test_a_rate_limit_said_with_403_is_transient(forge, call):
    answer_with(forge, call, (403, {"message": "API rate limit exceeded"}, {"X-RateLimit-Remaining": "0"}))
    failure = refused(CALLS[call], forge)
    assert (failure.reason, failure.transient) == ("forge-rate-limited", True)


@pytest.mark.parametrize("call", CALLS)
def test_an_answer_that_is_not_the_expected_json_is_transient(forge, call):
    answer_with(forge, call, (201 if call == "open" else 200, b"<html>proxy error</html>"))
    failure = refused(CALLS[call], forge)
    assert (failure.reason, failure.transient) == ("forge-malformed-answer", True)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("name", FORGES)
def test_no_answer_at_all_is_transient(fake_forge, name, call):
    forge = setup(name, fake_forge)
    forge.client.base_url = "http://127.0.0.1:1"  # nothing listens there
    forge.client.timeout = 1
    failure = refused(CALLS[call], forge)
    assert (failure.reason, failure.transient) == ("forge-unreachable", True)


@pytest.mark.parametrize("call", CALLS)
def test_a_forge_too_slow_to_answer_is_transient(fake_forge, call):
    forge = setup("github", fake_forge, timeout=0.5)
    answer_with(forge, call, (200, 2.0))  # answers after 2 s
    failure = refused(CALLS[call], forge)
    assert (failure.reason, failure.transient) == ("forge-unreachable", True)


def test_a_redirect_is_refused_not_followed(fake_forge):
    forge = setup("forgejo", fake_forge)
    answer_with(forge, "pull_head", (302, {}, {"Location": "http://example.com/"}))
    failure = refused(CALLS["pull_head"], forge)
    assert (failure.reason, failure.transient) == ("forge-redirect-refused", False)


# --- the forges' limits, for the publisher -------------------------------------------------------------------------

def test_each_forge_says_what_it_accepts():
    assert (GitHubClient.max_comment_chars, GitHubClient.max_file_bytes) == (65_536, 100 * 1024 * 1024)
    assert GitLabClient.max_comment_chars == 1_000_000
    assert ForgejoClient.max_comment_chars == 65_535
    assert AzureClient.max_comment_chars == 150_000
    for client in (GitHubClient, GitLabClient, ForgejoClient, AzureClient):
        assert 0 < client.max_file_bytes <= 100 * 1024 * 1024
        assert client.token_variables and client.url_variable  # still reserved for secrets' names
        assert not hasattr(client, "container_environment")  # a job's container holds no forge credential


# --- the stand-in's git side, for tests of pull-request-triggered jobs ----------------------------------------------

@pytest.mark.parametrize("name, fork, ref", [
    ("github", None, "refs/pull/12/head"), ("gitlab", "someone/fork", "refs/merge-requests/12/head"),
    ("forgejo", "someone/fork", "refs/pull/12/head"), ("azure", None, "refs/heads/feature/login"),
    ("azure", "someone/fork", "refs/pull/12/merge"),
])
def test_a_registered_pull_request_is_fetchable_by_its_fetch_ref(fake_forge, tmp_path, name, fork, ref):
    git_name = {"github": "acme/web", "gitlab": "group/proj", "forgejo": "kostekIV/test", "azure": "web"}[name]
    make_repository(tmp_path, git_name, {"README.md": "hello\n"})
    head_sha = make_repository(tmp_path / "elsewhere", "fork", {"README.md": "changed\n"})
    bare = tmp_path / f"{git_name}.git"
    git(bare, "fetch", "-q", str(tmp_path / "elsewhere" / "fork.git"), "main:refs/fork-head")  # the commit's objects
    fake_forge.serve_git(tmp_path, "Basic unused")
    forge = setup(name, fake_forge)

    forge.add(number=12, head="feature/login", sha=head_sha, fork=fork)

    assert forge.client.pull_head(forge.ref, 12, CREDENTIAL).fetch_ref == ref
    assert git(bare, "rev-parse", ref) == head_sha


def test_a_created_pull_request_records_its_branchs_tip(fake_forge, tmp_path):
    main = make_repository(tmp_path, "acme/web", {"README.md": "hello\n"})
    bare = tmp_path / "acme/web.git"
    git(bare, "branch", "pi/issue-7", main)
    fake_forge.serve_git(tmp_path, "Basic unused")
    forge = setup("github", fake_forge)

    open_pull(forge)

    assert forge.server.created_pull_requests[0]["sha"] == main
