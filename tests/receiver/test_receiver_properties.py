"""Property tests: random bodies, headers and sizes at all four endpoints, unsigned and correctly signed (so
the payload reaches the normalisers and matching). No input may produce a 5xx, and none may reach the
inbox's last-resort error path (a bug we would otherwise hide behind a 202)."""

import copy
import json

import pytest
from django.conf import settings as django_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from apps.receiver.models import Delivery
from tests.receiver_support import (
    GITLAB_SIGNING_SECRET,
    GITLAB_TOKEN_SECRET,
    azure_basic_headers,
    forgejo_headers,
    github_headers,
    gitlab_signature_headers,
    gitlab_token_headers,
    load,
    post,
    rule,
)

pytestmark = pytest.mark.django_db
set_hypothesis_home_dir(str(django_settings.VAR_DIR / "hypothesis"))  # not a .hypothesis/ folder in the checkout

FORGES = ("github", "gitlab", "forgejo", "azure")
BASE_PAYLOADS = {  # (the event header the forge sends with it, the payload)
    "github": [("issues", load("github/issues_labeled.json")),
               ("issue_comment", load("github/issue_comment_created.json")),
               ("pull_request", load("github/pull_request_opened.json")),
               ("pull_request_review", load("github/pull_request_review_submitted.json")),
               ("pull_request", load("github/pull_request_closed.json"))],
    "gitlab": [("Issue Hook", load("gitlab/issue_update_labels.json")),
               ("Merge Request Hook", load("gitlab/merge_request_update_labels.json")),
               ("Note Hook", load("gitlab/note_issue.json"))],
    "forgejo": [("issues", load("forgejo/issues_label_updated.json")),
                ("pull_request", load("forgejo/pull_request_label_updated.json"))],
    "azure": [("", load("azure/workitem_updated_tags.json")), ("", load("azure/workitem_commented.json")),
              ("", load("azure/pullrequest_comment.json"))],
}
EVENTS = {
    "github": ["issues", "issue_comment", "pull_request", "pull_request_review", "push", "ping", ""],
    "gitlab": ["Issue Hook", "Note Hook", "Merge Request Hook", "System Hook", "Push Hook"],
    "forgejo": ["issues", "issue_comment", "pull_request", "push", "release"],
    "azure": [""],
}
ACTIONS = ["opened", "labeled", "closed", "created", "submitted", "synchronize", "reopened", "label_updated",
           "synchronized", "open", "update", "close", "approved", "merge", "edited", "", None, 7]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
header_names = st.sampled_from([
    "X-GitHub-Event", "X-GitHub-Delivery", "X-Hub-Signature-256", "X-Gitlab-Event", "X-Gitlab-Token",
    "webhook-id", "webhook-timestamp", "webhook-signature", "Idempotency-Key", "X-Gitlab-Event-UUID",
    "X-Forgejo-Signature", "X-Gitea-Signature", "X-Gitea-Event", "X-Gitea-Delivery", "X-Forgejo-Delivery",
    "X-Forgejo-Event", "Authorization", "X-Pi-Hook-Key", "Content-Length", "X-Anything",
])
# What can arrive as a header value: any text (a WSGI server hands over Latin-1, an ASGI one may not), and
# numbers in every shape `str.isdigit` or `int` would take: superscripts, other scripts' digits, signs, `_`.
DIGITS_OF_ANY_SCRIPT = "0123456789\u00b9\u00b2\u00b3\u2070\u0660\u0661\u06f4\u0967\U0001d7d7"  # all str.isdigit()
numberlike = (st.text(alphabet=DIGITS_OF_ANY_SCRIPT, min_size=1, max_size=12)
              | st.text(alphabet=DIGITS_OF_ANY_SCRIPT + " +-_.x", min_size=1, max_size=24))
header_values = (st.text(alphabet=st.characters(min_codepoint=32, exclude_categories=("Cs",)), max_size=80)
                 | numberlike | st.integers(-2**70, 2**70).map(str))
PROPERTY_SETTINGS = hypothesis_settings(
    max_examples=60, deadline=None, derandomize=True, database=None,  # reproducible runs
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def armed(forges):
    """Rules on every route of every forge, and a forge API that allows everyone, so inputs go deep."""
    forges.fallback = (200, {"permission": "write", "access_level": 40, "value": "aad.x", "id": 1,
                             "count": 1, "value_list": []})
    rules = [
        dict(kind="github", on_type="label", label_any=["pi"], flow="fix-bug"),
        dict(kind="github", on_type="comment", phrase="@pi", flow="triage"),
        dict(kind="github", on_type="pull_request", actions=["opened", "synchronize", "review_submitted"],
             flow="review"),
        dict(kind="github", on_type="pull_request", actions=["labeled"], label_any=["pi-review"], flow="review",
             replicas=2),
        dict(kind="github", on_type="issue", actions=["closed"], flow="retro"),
        dict(kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug"),
        dict(kind="gitlab", on_type="comment", phrase="@pi", flow="triage"),
        dict(kind="gitlab", on_type="pull_request", actions=["update", "open"], flow="review"),
        dict(kind="gitlab", on_type="issue", actions=["close"], number=5, once=True, flow="retro"),
        dict(kind="forgejo", on_type="label", label_any=["pi"], flow="fix-bug"),
        dict(kind="forgejo", on_type="pull_request", actions=["label_updated"], label_any=["pi-review"], flow="review"),
        dict(kind="azure", on_type="label", label_any=["pi-fix"], repository="storefront", flow="fix-bug"),
        dict(kind="azure", on_type="comment", phrase="@pi", repository="storefront", flow="triage"),
    ]
    for position, fields in enumerate(rules):
        rule(position=position, **fields)
    return forges


def signed_headers(forge: str, body: bytes, event: str, delivery: str) -> dict:
    if forge == "github":
        return github_headers(body, event, delivery)
    if forge == "gitlab":
        return gitlab_token_headers(event, delivery)
    if forge == "forgejo":
        return forgejo_headers(body, event, delivery)
    return azure_basic_headers()


def use_gitlab_mode(settings, mode: str) -> None:
    settings.GITLAB_WEBHOOK_MODE = mode
    settings.GITLAB_WEBHOOK_SECRET = GITLAB_SIGNING_SECRET if mode == "signature" else GITLAB_TOKEN_SECRET


def assert_no_hidden_errors():
    assert not Delivery.objects.filter(reason="processing-error").exists(), "an input reached the last-resort path"


@PROPERTY_SETTINGS
@given(forge=st.sampled_from(FORGES), body=st.binary(max_size=2048),
       headers=st.dictionaries(header_names, header_values, max_size=8),
       # Malformed ones only: the test client cannot send fewer bytes than a well-formed one declares.
       content_length=st.none() | header_values.filter(lambda value: not (value.isascii() and value.isdigit())),
       content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", ""]),
       method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
       gitlab_mode=st.sampled_from(["token", "signature"]))
def test_random_requests_never_5xx(client, armed, settings, forge, body, headers, content_length, content_type,
                                   method, gitlab_mode):
    use_gitlab_mode(settings, gitlab_mode)
    headers = {k: v for k, v in headers.items() if k != "Content-Length"}  # the test client's is CONTENT_LENGTH
    declared = {"CONTENT_LENGTH": content_length} if content_length is not None else {}
    response = client.generic(method, f"/hooks/{forge}", data=body, content_type=content_type, headers=headers,
                              **declared)
    assert response.status_code < 500
    assert response["Content-Type"] == "application/json"


@PROPERTY_SETTINGS
@given(forge=st.sampled_from(FORGES), payload=json_values, data=st.data())
def test_signed_random_json_never_5xx(client, armed, forge, payload, data):
    body = json.dumps(payload).encode()
    event = data.draw(st.sampled_from(EVENTS[forge]))
    delivery = data.draw(header_values.filter(str.strip))
    response = post(client, forge, body, signed_headers(forge, body, event, delivery))
    assert response.status_code < 500
    assert_no_hidden_errors()


@hypothesis_settings(PROPERTY_SETTINGS, max_examples=200)
@given(forge=st.sampled_from(FORGES + ("gitlab-signature",)), value=header_values, data=st.data())
def test_signed_requests_with_one_header_of_any_shape_never_5xx(client, armed, settings, forge, value, data):
    """A correctly signed delivery with one of its own headers (signed or not) replaced by anything: every
    verifier, and every numeric header, sees shapes no forge sends."""
    use_gitlab_mode(settings, "signature" if forge == "gitlab-signature" else "token")
    forge = forge.removesuffix("-signature")
    event, payload = data.draw(st.sampled_from(BASE_PAYLOADS[forge]))
    body = json.dumps(payload).encode()
    delivery = data.draw(st.uuids()).hex
    if settings.GITLAB_WEBHOOK_MODE == "signature" and forge == "gitlab":
        headers = gitlab_signature_headers(body, event, delivery)
    else:
        headers = signed_headers(forge, body, event, delivery)
    name = data.draw(st.sampled_from(sorted(headers)))
    response = post(client, forge, body, {**headers, name: value})
    assert response.status_code < 500
    assert_no_hidden_errors()


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, prefix + (index,))


def _replace(document, path, new_value):
    if not path:
        return new_value
    target = document
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new_value
    return document


@hypothesis_settings(PROPERTY_SETTINGS, max_examples=200)
@given(forge=st.sampled_from(FORGES), data=st.data())
def test_signed_mutations_of_real_payloads_never_5xx(client, armed, forge, data):
    """Real payloads with a few subtrees replaced by anything: the shapes forges send, almost."""
    event, original = data.draw(st.sampled_from(BASE_PAYLOADS[forge]))
    payload = copy.deepcopy(original)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(_paths(payload))
        path = data.draw(st.sampled_from(paths[1:] or paths))
        replacement = data.draw(json_values | st.sampled_from(ACTIONS))
        payload = _replace(payload, path, replacement)
    body = json.dumps(payload).encode()
    if data.draw(st.integers(0, 9)) == 0:
        event = data.draw(st.sampled_from(EVENTS[forge]))
    delivery = data.draw(st.uuids()).hex
    response = post(client, forge, body, signed_headers(forge, body, event, delivery))
    assert response.status_code < 500
    assert_no_hidden_errors()


@PROPERTY_SETTINGS
@given(forge=st.sampled_from(FORGES), size=st.integers(0, 6000))
def test_sizes_around_the_limit_never_5xx(client, armed, settings, forge, size):
    settings.PI_WEBHOOK_MAX_BYTES = 4096
    body = json.dumps({"id": "sized", "pad": "x" * size}).encode()
    response = post(client, forge, body, signed_headers(forge, body, EVENTS[forge][0], f"size-{size}"))
    assert response.status_code < 500
    assert (response.status_code == 413) == (len(body) > 4096)
