"""A signed delivery naming a repository no forge could have named is refused before anything is queued (issue 53
§3): `#`, `:`, `?`, `%2f..`, a `..` segment, a control character, a space. Real names of every forge still pass
(the corpus test posts the forges' own payloads)."""

import pytest

from apps.receiver import sample_deliveries
from tests.receiver_support import queued, rule

pytestmark = pytest.mark.django_db

UNNAMABLE = ["acme/web#frag", "acme/web:8080", "acme/web?x=1", "acme/%2f..%2fetc", "acme/..", "acme/we b",
             "acme/web\x00", "acme/wéb"]


def send(client, forge: str, repository: str, event: str | None = None):
    sample = sample_deliveries.build(forge, event, repository=repository)
    return client.post(f"/hooks/{forge}", data=sample.body, content_type="application/json", headers=sample.headers)


@pytest.mark.parametrize("forge", ["github", "forgejo", "gitlab"])
@pytest.mark.parametrize("repository", UNNAMABLE)
def test_a_name_no_forge_can_write_is_refused_and_queues_nothing(client, forges, redis_conn, forge, repository):
    rule(position=0, kind=forge, on_type="label", label_any=["pi"], flow="fix-bug")
    response = send(client, forge, repository)
    assert (response.status_code, response.json()) == (400, {"error": "repository-invalid"})
    assert queued(redis_conn) == []


@pytest.mark.parametrize("project", ["Web#1", "Web?x", "Web%2f..", "Web:8080", ".hidden", "a\x07b"])
def test_an_azure_project_no_azure_devops_can_name_is_refused(client, forges, redis_conn, project):
    rule(position=0, kind="azure", on_type="label", label_any=["pi"], flow="fix-bug", repository="web")
    response = send(client, "azure", project, "workitem.updated")
    assert (response.status_code, response.json()) == (400, {"error": "repository-invalid"})
    assert queued(redis_conn) == []


@pytest.mark.parametrize("forge, repository", [("github", "acme/.github"), ("github", "Acme-Corp/web.site_2"),
                                               ("forgejo", "acme/web"), ("gitlab", "group/sub.group/web-app"),
                                               ("azure", "Fabrikam Fiber")])
def test_names_the_forges_write_are_taken(client, forges, redis_conn, forge, repository):
    """Taken past the name (what follows is the forge's authority check against the stand-in: GitHub's sample
    queues its job)."""
    rule(position=0, kind=forge, on_type="label", label_any=["pi"], flow="fix-bug",
         **({"repository": "web"} if forge == "azure" else {}))
    response = send(client, forge, repository, "workitem.updated" if forge == "azure" else None)
    assert response.status_code in (200, 202) and "error" not in response.json(), response.json()
    if forge == "github":
        assert len(queued(redis_conn)) == 1
