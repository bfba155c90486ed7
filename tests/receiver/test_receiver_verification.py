"""Every forge's credential check and every status code before a delivery is stored (DESIGN section 3)."""

import base64
import json
import time

import pytest

from apps.receiver.hooks.base import HookRefused, read_bounded_body
from apps.receiver.models import Delivery
from tests.receiver_support import (
    AZURE_HEADER,
    AZURE_HEADER_VALUE,
    GITLAB_SIGNING_SECRET,
    azure_basic_headers,
    dumps,
    forgejo_headers,
    github_headers,
    gitlab_signature,
    gitlab_signature_headers,
    gitlab_token_headers,
    load,
    post,
)

pytestmark = pytest.mark.django_db

BODIES = {
    "github": dumps(load("github/issues_labeled.json")),
    "gitlab": dumps(load("gitlab/issue_update_labels.json")),
    "forgejo": dumps(load("forgejo/issues_label_updated.json")),
    "azure": dumps(load("azure/workitem_updated_tags.json")),
}


def good_headers(forge, body, delivery="d-1"):
    return {
        "github": lambda: github_headers(body, "issues", delivery),
        "gitlab": lambda: gitlab_token_headers("Issue Hook", delivery),
        "forgejo": lambda: forgejo_headers(body, "issues", delivery),
        "azure": lambda: azure_basic_headers(),
    }[forge]()


def assert_refused(response, status, error):
    assert (response.status_code, response.json()) == (status, {"error": error})
    assert response["Content-Type"] == "application/json"
    assert Delivery.objects.count() == 0


FORGES = ["github", "gitlab", "forgejo", "azure"]


@pytest.mark.parametrize("forge", FORGES)
def test_verified_delivery_is_stored_and_answered(client, forges, forge):
    body = BODIES[forge]
    response = post(client, forge, body, good_headers(forge, body))
    assert response.status_code == 200 and response.json()["status"] == "ignored"  # no rules: verified, ignored
    assert Delivery.objects.get().forge == forge


@pytest.mark.parametrize("forge", FORGES)
def test_not_post_is_405(client, forges, forge):
    for method in (client.get, client.put, client.delete):
        assert_refused(method(f"/hooks/{forge}"), 405, "method-not-allowed")


@pytest.mark.parametrize("forge", FORGES)
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "", "application/jsonx"])
def test_not_json_is_415(client, forges, forge, content_type):
    body = BODIES[forge]
    response = client.post(f"/hooks/{forge}", data=body, content_type=content_type, headers=good_headers(forge, body))
    assert_refused(response, 415, "unsupported-media-type")


@pytest.mark.parametrize("forge", FORGES)
def test_json_media_type_parameters_and_case_are_accepted(client, forges, forge):
    body = BODIES[forge]
    response = client.post(f"/hooks/{forge}", data=body, content_type="Application/JSON; charset=utf-8",
                           headers=good_headers(forge, body))
    assert response.status_code == 200


@pytest.mark.parametrize("forge", FORGES)
def test_oversized_body_is_413(client, forges, settings, forge):
    settings.PI_WEBHOOK_MAX_BYTES = 1024
    body = json.dumps({"id": "big", "padding": "x" * 2048}).encode()
    assert_refused(post(client, forge, body, good_headers(forge, body)), 413, "payload-too-large")


def test_the_bound_holds_while_streaming_too(settings):
    settings.PI_WEBHOOK_MAX_BYTES = 100_000

    class Chunked:  # no Content-Length: only the running total can stop it
        META = {}

        def __init__(self):
            self.sent = 0

        def read(self, size):
            self.sent += size
            return b"x" * size

    request = Chunked()
    with pytest.raises(HookRefused) as refused:
        read_bounded_body(request)
    assert refused.value.status == 413 and request.sent <= 100_000 + 64 * 1024


@pytest.mark.parametrize("forge", FORGES)
def test_unconfigured_forge_is_404(client, settings, forge):
    for name in ("GITHUB_WEBHOOK_SECRET", "GITHUB_SELF_ID"):
        setattr(settings, name, "")
    response = client.post(f"/hooks/{forge}", data=b"{}", content_type="application/json")
    assert_refused(response, 404, "forge-not-configured")


def test_unknown_forge_path_is_404(client, forges):
    assert_refused(client.post("/hooks/bitbucket", data=b"{}", content_type="application/json"), 404, "unknown-forge")


@pytest.mark.parametrize("forge", FORGES)
def test_trailing_slash_and_query_string(client, forges, forge):
    body = BODIES[forge]
    response = client.post(f"/hooks/{forge}/?source=test", data=body, content_type="application/json",
                           headers=good_headers(forge, body))
    assert response.status_code == 200


@pytest.mark.parametrize("forge", FORGES)
def test_verified_body_that_is_not_a_json_object_is_400(client, forges, forge):
    for body in (b"not json", b"[1, 2]", b"\xff\xfe\x00", b"null", b'"text"'):
        response = post(client, forge, body, good_headers(forge, body))
        assert_refused(response, 400, "invalid-json")


# --- routing is by path only ------------------------------------------------------------------------------------

def test_forgejo_delivery_sent_to_the_github_path_faces_githubs_secret(client, forges):
    body = BODIES["forgejo"]  # Forgejo also sends X-GitHub-* and X-Hub-Signature-256
    assert_refused(post(client, "github", body, forgejo_headers(body, "issues", "d-x")), 401, "invalid-signature")


def test_github_delivery_sent_to_the_forgejo_path_faces_forgejos_secret(client, forges):
    body = BODIES["github"]
    assert_refused(post(client, "forgejo", body, github_headers(body, "issues", "d-x")), 401, "invalid-signature")


# --- GitHub ----------------------------------------------------------------------------------------------------

def test_github_header_order(client, forges):
    body = BODIES["github"]
    headers = github_headers(body, "issues", "d-1")
    assert_refused(post(client, "github", body, {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"}),
                   401, "missing-signature")
    for missing in ("X-GitHub-Event", "X-GitHub-Delivery"):
        assert_refused(post(client, "github", body, {k: v for k, v in headers.items() if k != missing}),
                       400, "missing-event-headers")


# --- Forgejo / Gitea --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("keep", [
    ("X-Forgejo-Signature", "X-Forgejo-Event", "X-Forgejo-Delivery"),
    ("X-Gitea-Signature", "X-Gitea-Event", "X-Gitea-Delivery"),
    ("X-Gogs-Signature", "X-Gogs-Event", "X-Gogs-Delivery"),
    ("X-Hub-Signature-256", "X-GitHub-Event", "X-GitHub-Delivery"),
])
def test_forgejo_accepts_each_header_family(client, forges, keep):
    body = BODIES["forgejo"]
    headers = {k: v for k, v in forgejo_headers(body, "issues", "d-fam").items() if k in keep}
    assert post(client, "forgejo", body, headers).status_code == 200


def test_forgejo_refusals(client, forges):
    body = BODIES["forgejo"]
    headers = forgejo_headers(body, "issues", "d-1")
    unsigned = {k: v for k, v in headers.items() if "Signature" not in k}
    assert_refused(post(client, "forgejo", body, unsigned), 401, "missing-signature")
    assert_refused(post(client, "forgejo", body, {**headers, "X-Forgejo-Signature": "0" * 64}), 401,
                   "invalid-signature")
    no_delivery = {k: v for k, v in headers.items() if "Delivery" not in k}
    assert_refused(post(client, "forgejo", body, no_delivery), 400, "missing-event-headers")


# --- GitLab ---------------------------------------------------------------------------------------------------

def test_gitlab_token_mode(client, forges):
    body = BODIES["gitlab"]
    headers = gitlab_token_headers("Issue Hook", "idem-1")
    assert_refused(post(client, "gitlab", body, {**headers, "X-Gitlab-Token": "guess"}), 401, "invalid-token")
    assert_refused(post(client, "gitlab", body, {k: v for k, v in headers.items() if k != "X-Gitlab-Token"}),
                   401, "missing-token")
    # A correct signature is not a token: the declared mode is the only one checked.
    signed = gitlab_signature_headers(body, "Issue Hook", "idem-2")
    assert_refused(post(client, "gitlab", body, signed), 401, "missing-token")


def test_gitlab_delivery_id_sources_and_their_absence(client, forges):
    body = BODIES["gitlab"]
    base = {"X-Gitlab-Event": "Issue Hook", "X-Gitlab-Token": "gitlab-shared-token"}
    assert post(client, "gitlab", body, {**base, "webhook-id": "wh-1"}).status_code == 200
    assert post(client, "gitlab", body, {**base, "Idempotency-Key": "idem-1"}).status_code == 200
    assert post(client, "gitlab", body, {**base, "X-Gitlab-Event-UUID": "uuid-1"}).status_code == 200
    assert set(Delivery.objects.values_list("delivery_id", flat=True)) == {"wh-1", "idem-1", "uuid-1"}
    Delivery.objects.all().delete()
    # Checked before the credential, so a probe learns nothing about the token.
    assert_refused(post(client, "gitlab", body, {**base, "X-Gitlab-Token": "wrong"}), 400, "missing-delivery-id")
    assert_refused(post(client, "gitlab", body, {"X-Gitlab-Token": "x", "Idempotency-Key": "i"}),
                   400, "missing-event-headers")


@pytest.fixture
def signature_mode(settings, forges):
    settings.GITLAB_WEBHOOK_MODE = "signature"
    settings.GITLAB_WEBHOOK_SECRET = GITLAB_SIGNING_SECRET
    return forges


def test_gitlab_signature_mode(client, signature_mode):
    body = BODIES["gitlab"]
    headers = gitlab_signature_headers(body, "Issue Hook", "wh-ok")
    assert post(client, "gitlab", body, headers).status_code == 200
    assert Delivery.objects.get().delivery_id == "wh-ok"


def test_gitlab_signature_refusals(client, signature_mode):
    body = BODIES["gitlab"]
    good = gitlab_signature_headers(body, "Issue Hook", "wh-1")
    cases = [
        ({k: v for k, v in good.items() if k != "webhook-signature"}, "missing-signature"),
        ({**good, "webhook-timestamp": "soon"}, "invalid-timestamp"),
        (gitlab_signature_headers(body, "Issue Hook", "wh-1", timestamp=int(time.time()) - 301), "stale-timestamp"),
        (gitlab_signature_headers(body, "Issue Hook", "wh-1", timestamp=int(time.time()) + 400), "stale-timestamp"),
        ({**good, "webhook-id": "wh-other"}, "invalid-signature"),  # the id is signed too
        (gitlab_signature_headers(b"{}", "Issue Hook", "wh-1"), "invalid-signature"),  # another body
        ({**good, "X-Gitlab-Token": "gitlab-shared-token", "webhook-signature": "v1,AAAA"}, "invalid-signature"),
    ]
    for headers, error in cases:
        assert_refused(post(client, "gitlab", body, headers), 401, error)


def to_arabic_indic(number: int) -> str:
    return "".join(chr(0x0660 + int(digit)) for digit in str(number))


# The ids name each case: the values hold the clock, and pytest-xdist's processes must collect the same names.
@pytest.mark.parametrize("timestamp", [
    "\u00b9\u00b2\u00b3",  # superscript digits: str.isdigit() says yes, int() raises
    "\u00b9" + str(int(time.time()))[1:],
    to_arabic_indic(int(time.time())),  # int() reads these, as the right time
    "+" + str(int(time.time())), "1_" + str(int(time.time()))[1:], str(int(time.time())) + ".0", "-1", "",
], ids=["superscript", "superscript-first", "arabic-indic", "plus", "underscore", "decimal", "negative", "empty"])
def test_gitlab_timestamps_are_ascii_digits_only(client, signature_mode, timestamp):
    body = BODIES["gitlab"]
    headers = gitlab_signature_headers(body, "Issue Hook", "wh-ts")
    # Signed over the very timestamp sent, so only the timestamp's own shape can refuse it.
    headers["webhook-signature"] = gitlab_signature(body, "wh-ts", timestamp)
    headers["webhook-timestamp"] = timestamp

    expected = "missing-signature" if not timestamp else "invalid-timestamp"
    assert_refused(post(client, "gitlab", body, headers), 401, expected)


@pytest.mark.parametrize("forge", FORGES)
@pytest.mark.parametrize("declared", ["1_0", "+10", "\u00b2", "\u0661\u0660", "0x10", "-1", "9" * 5000])
def test_a_content_length_is_ascii_digits_only(client, forges, forge, declared):
    body = BODIES[forge]
    response = client.post(f"/hooks/{forge}", data=body, content_type="application/json",
                           headers=good_headers(forge, body), CONTENT_LENGTH=declared)
    assert_refused(response, 400, "invalid-content-length")


def test_gitlab_signature_rotation_and_other_versions(client, signature_mode):
    body = BODIES["gitlab"]
    good = gitlab_signature_headers(body, "Issue Hook", "wh-rot")
    other_key = base64.b64encode(b"o" * 32).decode()
    old = gitlab_signature_headers(body, "Issue Hook", "wh-rot", key=other_key)["webhook-signature"]
    headers = {**good, "webhook-signature": f"v1a,xyz {old} {good['webhook-signature']}"}
    assert post(client, "gitlab", body, headers).status_code == 200


# --- Azure DevOps ---------------------------------------------------------------------------------------------

def test_azure_basic_mode(client, forges):
    body = BODIES["azure"]
    assert_refused(post(client, "azure", body, {}), 401, "missing-credential")
    assert_refused(post(client, "azure", body, azure_basic_headers(password="wrong")), 401, "invalid-credential")
    bearer = {"Authorization": "Bearer " + azure_basic_headers()["Authorization"].split()[1]}
    assert_refused(post(client, "azure", body, bearer), 401, "invalid-credential")
    lower = {"Authorization": "basic " + azure_basic_headers()["Authorization"].split()[1]}
    assert_refused(post(client, "azure", body, lower), 401, "invalid-credential")


def test_azure_secret_may_be_given_as_its_base64(client, forges, settings):
    settings.AZURE_WEBHOOK_SECRET = azure_basic_headers()["Authorization"].split()[1]
    body = BODIES["azure"]
    assert post(client, "azure", body, azure_basic_headers()).status_code == 200


def test_azure_header_mode(client, forges, settings):
    settings.AZURE_WEBHOOK_MODE = "header"
    settings.AZURE_WEBHOOK_HEADER = AZURE_HEADER
    settings.AZURE_WEBHOOK_SECRET = AZURE_HEADER_VALUE
    body = BODIES["azure"]
    assert post(client, "azure", body, {AZURE_HEADER.lower(): AZURE_HEADER_VALUE}).status_code == 200
    Delivery.objects.all().delete()
    assert_refused(post(client, "azure", body, azure_basic_headers()), 401, "missing-credential")
    assert_refused(post(client, "azure", body, {AZURE_HEADER: "nope"}), 401, "invalid-credential")


def test_azure_delivery_id_is_the_bodys_id(client, forges):
    for payload in ({"eventType": "workitem.updated"}, {"id": "", "eventType": "x"}, {"id": 42}):
        assert_refused(post(client, "azure", dumps(payload), azure_basic_headers()), 400, "missing-delivery-id")
    assert_refused(post(client, "azure", dumps({"id": "x" * 201}), azure_basic_headers()), 400, "invalid-delivery-id")
