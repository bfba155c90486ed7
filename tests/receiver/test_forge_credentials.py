"""What a job (and the receiver's lookups, and a comment) acts with on each forge: a GitHub App's installation
token, exchanged for a real RS256 JWT that the test server verifies with the App's public key, or a
personal access token; and what happens when the credential is missing, broken or refused."""

import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from apps.worker.forges import ForgeFailure, RepoRef, Subject, forge_client
from apps.worker.forges.github import FORK_PERMISSIONS, FORK_PUSH_PERMISSIONS, JOB_PERMISSIONS

APP_ID, INSTALLATION_ID = "12345", "678"


def _key():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return pem, key.public_key()


@pytest.fixture(scope="module")
def app_key():
    return _key()


@pytest.fixture
def github_app(settings, forges, app_key):
    """GitHub configured as an App (and a PAT beside it, which the App must win over)."""
    pem, public_key = app_key
    settings.GITHUB_APP_ID = APP_ID
    settings.GITHUB_APP_INSTALLATION_ID = INSTALLATION_ID
    settings.GITHUB_APP_PRIVATE_KEY = pem
    settings.GITHUB_APP_PRIVATE_KEY_PATH = ""
    forges.github_app(APP_ID, INSTALLATION_ID, public_key, account="acme")
    return forges


def exchanges(server):
    return [r for r in server.requests if r["path"] == f"/app/installations/{INSTALLATION_ID}/access_tokens"]


# --- GitHub App ------------------------------------------------------------------------------------------------

def test_a_job_token_is_minted_for_its_one_repository_with_a_verified_rs256_jwt(github_app, app_key):
    before = int(time.time())
    credential = forge_client("github").job_credential(RepoRef("acme/web"))

    assert (credential.token, credential.source) == ("ghs_jobtoken-1", "app")
    (exchange,) = exchanges(github_app)
    # Scoped to the one repository and to what publishing needs: never `workflows`, nor anything else.
    assert exchange["body"] == {"repositories": ["web"], "permissions": {
        "contents": "write", "pull_requests": "write", "issues": "write"}}
    assert github_app.minted == [{"token": "ghs_jobtoken-1", "installation": INSTALLATION_ID,
                                  "repositories": ["acme/web"], "permissions": JOB_PERMISSIONS}]
    assert "workflows" not in JOB_PERMISSIONS
    presented = exchange["headers"]["authorization"].removeprefix("Bearer ")
    claims = jwt.decode(presented, app_key[1], algorithms=["RS256"])
    assert jwt.get_unverified_header(presented)["alg"] == "RS256"
    assert claims["iss"] == APP_ID
    assert claims["iat"] <= before - 59 and claims["exp"] - claims["iat"] == 600  # backdated, 10 minutes at most
    assert "ghs_" not in repr(credential)  # a token never shows up in a repr (and so in a traceback)


def test_each_job_gets_its_own_token_and_gives_it_back(github_app):
    client = forge_client("github")
    first = client.job_credential(RepoRef("acme/web"))
    second = client.job_credential(RepoRef("acme/web"))
    assert first.token != second.token and len(exchanges(github_app)) == 2

    client.release_credential(first)

    revoke = github_app.requests[-1]
    assert (revoke["method"], revoke["path"]) == ("DELETE", "/installation/token")
    assert revoke["headers"]["authorization"] == f"Bearer {first.token}"


def test_the_app_wins_over_a_configured_pat(github_app, settings):
    assert settings.GITHUB_TOKEN  # the forges fixture set one
    assert forge_client("github").job_credential(RepoRef("acme/web")).source == "app"


def test_a_jwt_signed_with_another_key_is_a_configuration_refusal(github_app, settings):
    settings.GITHUB_APP_PRIVATE_KEY = _key()[0]

    with pytest.raises(ForgeFailure) as refused:
        forge_client("github").job_credential(RepoRef("acme/web"))

    assert (refused.value.reason, refused.value.transient) == ("forge-auth-refused", False)


def test_a_repository_outside_the_installation_is_refused(github_app):
    github_app.routes[("POST", f"/app/installations/{INSTALLATION_ID}/access_tokens")] = (
        422, {"message": "There is at least one repository that does not exist or is not accessible"})
    with pytest.raises(ForgeFailure) as refused:
        forge_client("github").job_credential(RepoRef("acme/private-elsewhere"))
    assert (refused.value.reason, refused.value.transient) == ("forge-repo-not-found", False)


def test_a_token_for_the_same_name_under_another_owner_is_refused(github_app):
    # The installation belongs to `acme`: a job for `evil/web` would get a token for acme/web.
    with pytest.raises(ForgeFailure) as refused:
        forge_client("github").job_credential(RepoRef("evil/web"))
    assert refused.value.reason == "forge-repo-not-found"


def test_an_exchange_the_forge_cannot_answer_now_is_transient(github_app):
    github_app.routes[("POST", f"/app/installations/{INSTALLATION_ID}/access_tokens")] = (503, {"message": "busy"})
    with pytest.raises(ForgeFailure) as failed:
        forge_client("github").job_credential(RepoRef("acme/web"))
    assert (failed.value.reason, failed.value.transient) == ("forge-unavailable", True)


def test_lookups_use_a_narrow_cached_token(github_app):
    github_app.github_permission("acme/web", "carl", "write")
    github_app.github_permission("acme/web", "dora", "read")
    client = forge_client("github")

    assert client.authority(Subject(repo="acme/web", login="carl")).allowed is True
    assert client.authority(Subject(repo="acme/web", login="dora")).allowed is False

    (exchange,) = exchanges(github_app)  # one token for both lookups
    assert exchange["body"] == {"repositories": ["web"], "permissions": {"metadata": "read"}}
    lookups = [r for r in github_app.requests if r["path"].endswith("/permission")]
    assert all(r["headers"]["authorization"] == "Bearer ghs_jobtoken-1" for r in lookups)


def test_a_lookup_whose_token_cannot_be_minted_is_could_not_tell(github_app):
    github_app.routes[("POST", f"/app/installations/{INSTALLATION_ID}/access_tokens")] = (500, {})
    answer = forge_client("github").authority(Subject(repo="acme/web", login="carl"))
    assert answer.allowed is None and answer.reason == "forge-unavailable"


def test_the_apps_identity_is_its_bot_account(github_app):
    github_app.routes["/users/pi-dispatch-test%5Bbot%5D"] = (200, {"login": "pi-dispatch-test[bot]", "id": 41898282,
                                                              "type": "Bot"})
    assert forge_client("github").self_identity().id == "41898282"
    assert github_app.requests[0]["path"] == "/app"


FORK_ORGANIZATION, FORK_INSTALLATION = "acme-pi-forks", "5150"


def test_an_app_forks_into_its_fork_organization_with_a_token_of_its_installation_there(github_app, settings):
    settings.GITHUB_FORK_ORGANIZATION = FORK_ORGANIZATION
    github_app.github_app_installed_on(FORK_ORGANIZATION, FORK_INSTALLATION)
    github_app.add_forks("github", "acme/web")
    client = forge_client("github")
    job = client.job_credential(RepoRef("acme/web"))

    fork = client.fork(RepoRef("acme/web"), job)

    assert fork.repo == f"{FORK_ORGANIZATION}/web"
    (create,) = [r for r in github_app.requests if r["path"] == "/repos/acme/web/forks"]
    assert create["body"] == {"organization": FORK_ORGANIZATION}
    # Made with a token of the fork organization's installation (the job's covers the one repository), minted for
    # this request with only what forking needs, and revoked at once.
    fork_token = github_app.minted[1]
    assert fork_token == {"token": "ghs_jobtoken-2", "installation": FORK_INSTALLATION, "repositories": [],
                          "permissions": FORK_PERMISSIONS}
    assert create["headers"]["authorization"] == "Bearer ghs_jobtoken-2"
    assert any(r["method"] == "DELETE" and r["headers"]["authorization"] == "Bearer ghs_jobtoken-2"
               for r in github_app.requests)

    # The job's branch is pushed with a token for the fork alone, contents only.
    push = client.fork_credential(fork, job)
    assert github_app.minted[2] == {"token": push.token, "installation": FORK_INSTALLATION,
                                    "repositories": [f"{FORK_ORGANIZATION}/web"], "permissions": FORK_PUSH_PERMISSIONS}
    assert "workflows" not in FORK_PUSH_PERMISSIONS and "administration" not in FORK_PUSH_PERMISSIONS


def test_an_app_without_a_fork_organization_or_not_installed_there_cannot_fork(github_app, settings):
    github_app.add_forks("github", "acme/web")
    client = forge_client("github")
    job = client.job_credential(RepoRef("acme/web"))
    with pytest.raises(ForgeFailure) as unset:
        client.fork(RepoRef("acme/web"), job)
    settings.GITHUB_FORK_ORGANIZATION = "not-installed-here"
    with pytest.raises(ForgeFailure) as not_installed:
        forge_client("github").fork(RepoRef("acme/web"), job)
    assert {unset.value.reason, not_installed.value.reason} == {"fork-unavailable"}
    assert not [r for r in github_app.requests if r["path"] == "/repos/acme/web/forks"]  # never asked to fork


def test_the_private_key_can_come_from_a_file_or_with_escaped_newlines(github_app, settings, app_key, tmp_path):
    key_file = tmp_path / "app.pem"
    key_file.write_text(app_key[0])
    settings.GITHUB_APP_PRIVATE_KEY, settings.GITHUB_APP_PRIVATE_KEY_PATH = "", str(key_file)
    assert forge_client("github").job_credential(RepoRef("acme/web")).source == "app"

    settings.GITHUB_APP_PRIVATE_KEY, settings.GITHUB_APP_PRIVATE_KEY_PATH = app_key[0].replace("\n", "\\n"), ""
    assert forge_client("github").job_credential(RepoRef("acme/web")).source == "app"


@pytest.mark.parametrize("change, named", [
    ({"GITHUB_APP_INSTALLATION_ID": ""}, "GITHUB_APP_INSTALLATION_ID"),
    ({"GITHUB_APP_PRIVATE_KEY": ""}, "GITHUB_APP_PRIVATE_KEY"),
    ({"GITHUB_APP_PRIVATE_KEY": "", "GITHUB_APP_PRIVATE_KEY_PATH": "/nonexistent/app.pem"}, "cannot be read"),
    ({"GITHUB_APP_PRIVATE_KEY": "not a key"}, "not a PEM private key"),
    ({"GITHUB_APP_ID": "my-app"}, "numeric"),
])
def test_an_incomplete_app_refuses_and_never_falls_back_to_the_pat(github_app, settings, change, named):
    for name, value in change.items():
        setattr(settings, name, value)

    with pytest.raises(ForgeFailure) as refused:
        forge_client("github").job_credential(RepoRef("acme/web"))
    assert (refused.value.reason, refused.value.transient) == ("forge-unconfigured", False)
    assert forge_client("github").authority(Subject(repo="acme/web", login="carl")).allowed is None
    assert exchanges(github_app) == []

    with pytest.raises(SystemCheckError) as check:
        call_command("check")
    assert "worker.E001" in str(check.value) and named in str(check.value)
    assert "-----BEGIN" not in str(check.value)  # the key itself is never part of the message


# --- personal access tokens ----------------------------------------------------------------------------------

@pytest.mark.parametrize("forge, setting, ref", [
    ("github", "GITHUB_TOKEN", RepoRef("acme/web")),
    ("gitlab", "GITLAB_TOKEN", RepoRef("group/proj", project_id="42")),
    ("forgejo", "FORGEJO_TOKEN", RepoRef("o/r")),
    ("azure", "AZURE_TOKEN", RepoRef("P/r")),
])
def test_a_pat_is_the_jobs_token(forges, settings, forge, setting, ref):
    client = forge_client(forge)
    credential = client.job_credential(ref)
    assert (credential.token, credential.source) == (getattr(settings, setting), "pat")

    client.release_credential(credential)  # a PAT is never revoked
    assert forges.requests == []

    setattr(settings, setting, "")
    with pytest.raises(ForgeFailure) as refused:
        forge_client(forge).job_credential(ref)
    assert refused.value.reason == "forge-unconfigured"
