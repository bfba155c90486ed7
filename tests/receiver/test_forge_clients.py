"""The outbound forge API clients (apps/worker/forges): exact requests, and "no" kept apart from "could not
tell", against a local HTTP server answering with each forge's documented shapes."""

import time

import pytest

from apps.worker.forges import IdentityUnavailable, Subject
from apps.worker.forges.azure import AzureClient, graph_url_for
from apps.worker.forges.forgejo import ForgejoClient
from apps.worker.forges.github import GitHubClient
from apps.worker.forges.gitlab import GitLabClient
from tests.receiver_support import AZURE_PROJECT_ID

ACTOR_GUID = "54d125f7-69f7-4191-904f-c5b96b6261c8"


def github(server, **kwargs):
    return GitHubClient(base_url=server.url, token="ghp-secret-token", timeout=2, **kwargs)


def gitlab(server, **kwargs):
    return GitLabClient(base_url=server.url, token="glpat-secret", timeout=2, **kwargs)


def forgejo(server, **kwargs):
    return ForgejoClient(base_url=server.url, token="fj-secret", timeout=2, **kwargs)


def azure(server, **kwargs):
    return AzureClient(base_url=server.url, token="azure-pat", graph_url=server.url, timeout=2, **kwargs)


# --- GitHub --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("permission, allowed", [("admin", True), ("write", True), ("maintain", True),
                                                 ("read", False), ("none", False)])
def test_github_collaborator_permission(fake_forge, permission, allowed):
    fake_forge.github_permission("acme/web", "closer-carl", permission)

    answer = github(fake_forge).authority(Subject(repo="acme/web", login="closer-carl"))

    assert answer.allowed is allowed
    request = fake_forge.requests[-1]
    assert request["path"] == "/repos/acme/web/collaborators/closer-carl/permission"
    assert request["headers"]["authorization"] == "Bearer ghp-secret-token"
    assert request["headers"]["accept"] == "application/vnd.github+json"
    assert request["headers"]["x-github-api-version"] == "2022-11-28"


def test_github_unknown_collaborator_is_a_determinate_no(fake_forge):
    answer = github(fake_forge).authority(Subject(repo="acme/web", login="stranger"))
    assert (answer.allowed, answer.determinate) == (False, True)


@pytest.mark.parametrize("status", [401, 403, 429, 500, 502])
def test_github_errors_are_could_not_tell(fake_forge, status):
    fake_forge.routes["/repos/acme/web/collaborators/carl/permission"] = (status, {"message": "nope"})

    answer = github(fake_forge).authority(Subject(repo="acme/web", login="carl"))

    assert answer.allowed is None and answer.reason == f"status-{status}"


@pytest.mark.parametrize("repo, login", [("acme", "carl"), ("acme/web/x", "carl"), ("acme/web", "../x"),
                                         ("acme/web", "a b"), ("acme/..", "carl"), ("acme/web", "c?x=1")])
def test_github_unaskable_inputs_are_no_without_a_request(fake_forge, repo, login):
    answer = github(fake_forge).authority(Subject(repo=repo, login=login))
    assert answer.allowed is False and fake_forge.requests == []


def test_github_identity(fake_forge):
    fake_forge.routes["/user"] = (200, {"login": "pi-bot", "id": 4242, "type": "User"})
    assert github(fake_forge).self_identity().id == "4242"

    fake_forge.routes["/user"] = (401, {"message": "Bad credentials"})
    with pytest.raises(IdentityUnavailable) as refused:
        github(fake_forge).self_identity()
    assert refused.value.determinate and refused.value.reason == "status-401"

    fake_forge.routes["/user"] = (503, {"message": "unavailable"})
    with pytest.raises(IdentityUnavailable) as flaky:
        github(fake_forge).self_identity()
    assert not flaky.value.determinate


# --- GitLab --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level, allowed", [(50, True), (40, True), (30, True), (29, False), (20, False),
                                            (10, False), (5, False), (0, False)])
def test_gitlab_developer_or_above_may_start_work(fake_forge, level, allowed):
    fake_forge.gitlab_member("42", 7, level)

    answer = gitlab(fake_forge).authority(Subject(repo="group/proj", project_id="42", actor_id="7"))

    assert answer.allowed is allowed
    request = fake_forge.requests[-1]
    assert request["path"] == "/api/v4/projects/42/members/all/7"  # members/all includes group members
    assert request["headers"]["private-token"] == "glpat-secret"


def test_gitlab_without_project_id_asks_by_encoded_path(fake_forge):
    fake_forge.gitlab_member("group%2Fsub%2Fproj", 7, 30)

    answer = gitlab(fake_forge).authority(Subject(repo="group/sub/proj", actor_id="7"))

    assert answer.allowed is True
    assert fake_forge.requests[-1]["path"] == "/api/v4/projects/group%2Fsub%2Fproj/members/all/7"


@pytest.mark.parametrize("answer_status, body, expected", [
    (404, {"message": "404 Not found"}, False),
    (500, {}, None), (401, {}, None), (429, {}, None),
    (200, {"access_level": "30"}, None), (200, {"access_level": None}, None), (200, [], None),
])
def test_gitlab_answers(fake_forge, answer_status, body, expected):
    fake_forge.routes["/api/v4/projects/42/members/all/7"] = (answer_status, body)
    assert gitlab(fake_forge).authority(Subject(project_id="42", actor_id="7")).allowed is expected


def test_gitlab_identity(fake_forge):
    fake_forge.routes["/api/v4/user"] = (200, {"id": 77, "username": "pi-bot"})
    assert gitlab(fake_forge).self_identity().id == "77"
    assert fake_forge.requests[-1]["headers"]["private-token"] == "glpat-secret"


# --- Forgejo / Gitea -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("permission, allowed", [("owner", True), ("admin", True), ("write", True),
                                                 ("read", False), ("none", False)])
def test_forgejo_repository_permission(fake_forge, permission, allowed):
    fake_forge.forgejo_permission("kostekIV/test", "kostekIV", permission)

    answer = forgejo(fake_forge).authority(Subject(repo="kostekIV/test", login="kostekIV"))

    assert answer.allowed is allowed
    request = fake_forge.requests[-1]
    assert request["path"] == "/api/v1/repos/kostekIV/test/collaborators/kostekIV/permission"
    assert request["headers"]["authorization"] == "token fj-secret"


def test_forgejo_403_is_could_not_tell_not_no(fake_forge):
    # A token that may not read permissions must surface as a problem, not as silent refusals.
    fake_forge.routes["/api/v1/repos/a/b/collaborators/c/permission"] = (403, {"message": "token scope"})
    answer = forgejo(fake_forge).authority(Subject(repo="a/b", login="c"))
    assert answer.allowed is None and answer.reason == "status-403"


# --- Azure DevOps ----------------------------------------------------------------------------------------------

def test_azure_project_member_through_graph(fake_forge):
    fake_forge.azure_member(ACTOR_GUID)

    answer = azure(fake_forge).authority(Subject(project_id=AZURE_PROJECT_ID, actor_id=ACTOR_GUID))

    assert answer.allowed is True
    assert fake_forge.paths() == [
        f"/_apis/graph/descriptors/{ACTOR_GUID}", f"/_apis/graph/descriptors/{AZURE_PROJECT_ID}",
        "/_apis/graph/groups", f"/_apis/graph/memberships/aad.{ACTOR_GUID[:8]}",
    ]
    assert all(request["query"]["api-version"] == ["7.1-preview.1"] for request in fake_forge.requests)
    assert fake_forge.requests[2]["query"]["scopeDescriptor"] == [f"scp.{AZURE_PROJECT_ID[:8]}"]
    assert fake_forge.requests[3]["query"]["direction"] == ["up"]
    assert fake_forge.requests[0]["headers"]["authorization"] == "Basic OmF6dXJlLXBhdA=="  # base64(":azure-pat")


def test_azure_readers_are_not_members_who_may_start_work(fake_forge):
    fake_forge.azure_member(ACTOR_GUID, member=False)
    answer = azure(fake_forge).authority(Subject(project_id=AZURE_PROJECT_ID, actor_id=ACTOR_GUID))
    assert answer.allowed is False


@pytest.mark.parametrize("group, allowed", [
    ("Contributors", True), ("Project Administrators", True), ("Build Administrators", True),
    ("Readers", False), ("Project Valid Users", False), ("Stakeholders (read-only)", False),
])
def test_azure_only_three_project_groups_may_start_work(fake_forge, group, allowed):
    """An allow list: a custom read-only group, or Project Valid Users (everyone who may see the project),
    is no licence to start paid work."""
    fake_forge.azure_member(ACTOR_GUID, group=group)
    answer = azure(fake_forge).authority(Subject(project_id=AZURE_PROJECT_ID, actor_id=ACTOR_GUID))
    assert (answer.allowed, answer.determinate) == (allowed, True)


def test_azure_groups_are_told_apart_by_descriptor_not_by_display_name(fake_forge):
    """A localised server names Readers "Leser" and Project Administrators "Projektadministratoren": the
    administrators' well-known SID still says who they are, and no other name lets a reader in."""
    localised = {"Readers": "Leser", "Project Administrators": "Projektadministratoren"}
    client = azure(fake_forge, cache_seconds=0)
    subject = Subject(project_id=AZURE_PROJECT_ID, actor_id=ACTOR_GUID)

    fake_forge.azure_member(ACTOR_GUID, group="Readers", names=localised)
    AzureClient.project_groups_cache.clear()
    assert client.authority(subject).allowed is False

    fake_forge.azure_member(ACTOR_GUID, group="Project Administrators", names=localised)
    AzureClient.project_groups_cache.clear()
    assert client.authority(subject).allowed is True

    # A group that merely calls itself Contributors is not the project's Contributors group.
    fake_forge.azure_member(ACTOR_GUID, group="Stakeholders (read-only)")
    for group in fake_forge.routes["/_apis/graph/groups"][1]["value"]:
        if group["displayName"] == "Stakeholders (read-only)":
            group["displayName"] = "Contributors"
    AzureClient.project_groups_cache.clear()
    assert client.authority(subject).allowed is False


def test_azure_writer_groups_can_be_named_for_a_localised_server(fake_forge):
    # Contributors has no well-known SID: a server whose process template says "Mitwirkende" names it.
    fake_forge.azure_member(ACTOR_GUID, group="Contributors", names={"Contributors": "Mitwirkende"})
    subject = Subject(project_id=AZURE_PROJECT_ID, actor_id=ACTOR_GUID)

    assert azure(fake_forge, cache_seconds=0).authority(subject).allowed is False
    localised = azure(fake_forge, writer_groups=("Mitwirkende", "Build-Administratoren"))
    assert localised.authority(subject).allowed is True


def test_azure_membership_through_a_nested_group(fake_forge):
    groups = fake_forge.azure_member(ACTOR_GUID)
    actor = f"aad.{ACTOR_GUID[:8]}"
    fake_forge.routes[f"/_apis/graph/memberships/{actor}"] = (200, {"value": [{"containerDescriptor": "aadgp.team"}]})
    fake_forge.routes["/_apis/graph/memberships/aadgp.team"] = (
        200, {"value": [{"containerDescriptor": groups["Contributors"]}]})

    assert azure(fake_forge).authority(Subject(project_id=AZURE_PROJECT_ID, actor_id=ACTOR_GUID)).allowed is True


def test_azure_email_actor_is_found_in_the_user_directory(fake_forge):
    fake_forge.azure_member(ACTOR_GUID)
    pages = {
        None: (200, {"value": [{"principalName": "other@fabrikam.com", "descriptor": "aad.other"}]},
               {"X-MS-ContinuationToken": "page-2"}),
        "page-2": (200, {"value": [{"principalName": "someone", "mailAddress": "Jamal@Fabrikam.com",
                                    "descriptor": f"aad.{ACTOR_GUID[:8]}"}]}),
    }
    fake_forge.routes["/_apis/graph/users"] = (
        lambda request: pages[(request["query"].get("continuationToken") or [None])[0]])

    answer = azure(fake_forge).authority(Subject(project_id=AZURE_PROJECT_ID, email="jamal@fabrikam.com"))

    assert answer.allowed is True


def test_azure_email_not_in_a_fully_listed_directory_is_no(fake_forge):
    fake_forge.routes["/_apis/graph/users"] = (200, {"value": []})
    answer = azure(fake_forge).authority(Subject(project_id=AZURE_PROJECT_ID, email="ghost@fabrikam.com"))
    assert answer.allowed is False


@pytest.mark.parametrize("status", [401, 500, 503])
def test_azure_errors_are_could_not_tell(fake_forge, status):
    fake_forge.routes[f"/_apis/graph/descriptors/{ACTOR_GUID}"] = (status, {})
    answer = azure(fake_forge).authority(Subject(project_id=AZURE_PROJECT_ID, actor_id=ACTOR_GUID))
    assert answer.allowed is None and answer.reason == f"status-{status}"


def test_azure_identity_from_connection_data(fake_forge):
    fake_forge.routes["/_apis/connectionData"] = (200, {"authenticatedUser": {
        "id": "0F0F0F0F-1111-2222-3333-444444444444", "providerDisplayName": "pi bot",
        "properties": {"Account": {"$type": "System.String", "$value": "Pi-Bot@Fabrikam.com"}}}})

    identity = azure(fake_forge).self_identity()

    assert (identity.id, identity.email) == ("0f0f0f0f-1111-2222-3333-444444444444", "pi-bot@fabrikam.com")


def test_azure_graph_lives_on_vssps():
    assert graph_url_for("https://dev.azure.com/fabrikam/") == "https://vssps.dev.azure.com/fabrikam"
    assert graph_url_for("https://fabrikam.visualstudio.com") == "https://fabrikam.vssps.visualstudio.com"
    assert graph_url_for("https://tfs.example.com/tfs/Default") == "https://tfs.example.com/tfs/Default"


# --- shared behaviour ------------------------------------------------------------------------------------------

def test_determinate_answers_are_cached_and_could_not_tell_is_not(fake_forge):
    fake_forge.routes["/api/v4/projects/42/members/all/7"] = (502, {})
    client = gitlab(fake_forge, cache_seconds=60)
    subject = Subject(project_id="42", actor_id="7")
    assert client.authority(subject).allowed is None
    fake_forge.gitlab_member("42", 7, 40)
    assert client.authority(subject).allowed is True
    assert client.authority(subject).allowed is True
    assert len(fake_forge.requests) == 2  # the 502 was asked again; the determinate answer came from the cache


def test_a_slow_forge_is_could_not_tell_within_the_timeout(fake_forge):
    fake_forge.routes["/api/v4/projects/42/members/all/7"] = (200, 3.0)  # answers after 3 s
    client = GitLabClient(base_url=fake_forge.url, token="t", timeout=0.5)

    started = time.monotonic()
    answer = client.authority(Subject(project_id="42", actor_id="7"))

    assert answer.allowed is None and answer.reason == "timeout"
    assert time.monotonic() - started < 2.5


def test_redirects_are_never_followed(fake_forge):
    # A redirect could carry the token to another host.
    fake_forge.routes["/api/v1/repos/a/b/collaborators/c/permission"] = (302, {}, {"Location": "http://example.com/"})
    answer = forgejo(fake_forge).authority(Subject(repo="a/b", login="c"))
    assert answer.allowed is None and answer.reason == "redirect"


def test_unreachable_forge_is_could_not_tell():
    client = GitLabClient(base_url="http://127.0.0.1:1", token="t", timeout=1)
    answer = client.authority(Subject(project_id="42", actor_id="7"))
    assert answer.allowed is None and answer.reason == "network"
