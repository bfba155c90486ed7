"""Exact and semantic dedup, replicas, and routing of jobs that bind a host capability."""

import hashlib
import threading

import pytest
from django.db import connections

from apps.receiver import intake
from apps.receiver.models import Delivery, DeliveryStatus
from tests.receiver_support import (
    dumps,
    forgejo_headers,
    github_headers,
    gitlab_token_headers,
    job_spec,
    load,
    post,
    queued,
    rule,
)

pytestmark = pytest.mark.django_db


def labelled(number=7, labels=("pi",)):
    payload = load("github/issues_labeled.json")
    payload["issue"]["number"] = number
    payload["issue"]["labels"] = [{"name": name} for name in labels]
    return payload


@pytest.fixture
def send(client, forges):
    def send(payload, delivery, event="issues"):
        body = dumps(payload)
        return post(client, "github", body, github_headers(body, event, delivery))

    return send


def test_a_second_label_event_for_the_same_issue_and_flow_is_swallowed(send, redis_conn, caplog):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")

    first = send(labelled(), "d-first").json()
    with caplog.at_level("INFO"):
        second = send(labelled(labels=("pi", "frontend")), "d-second")

    assert first == {"status": "queued", "jobs": ["gh-d-first"]}
    assert second.status_code == 202
    assert second.json() == {"status": "duplicate", "rule": "dedup-window", "jobs": ["gh-d-first"]}
    assert queued(redis_conn) == ["gh-d-first"]
    assert "job=gh-d-second surviving=gh-d-first" in caplog.text
    delivery = Delivery.objects.get(delivery_id="d-second")
    assert (delivery.status, delivery.job_ids, delivery.payload) == (DeliveryStatus.DUPLICATE, ["gh-d-first"], None)
    assert redis_conn.pttl("pidispatch:dedup:github:acme/web#7:fix-bug") > 590_000  # 10-minute window


def commented(text, number=7, comments=1):
    payload = load("github/issue_comment_created.json")
    payload["issue"]["number"] = number
    payload["issue"]["comments"] = comments  # what differs between a forge's two sends of one comment
    payload["comment"]["body"] = text
    return payload


@pytest.fixture
def label_and_comment_rules(forges):
    forges.github_permission("acme/web", "maintainer-mia", "write")
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    rule(position=1, kind="github", on_type="comment", phrase="/pi", flow="fix-bug")


def test_a_writers_follow_up_comment_is_a_new_request_not_the_labelled_jobs_duplicate(
        send, label_and_comment_rules, redis_conn, caplog):
    """The labelled job of a moment ago, then a comment on the same issue choosing the same flow: two jobs."""
    labelled_job = send(labelled(), "d-label").json()
    with caplog.at_level("INFO"):
        follow_up = send(commented("/pi fix-bug now also handle the empty case"), "d-follow-up", "issue_comment")
        # Another new comment is new too.
        third = send(commented("/pi fix-bug and the README"), "d-third", "issue_comment").json()

    assert labelled_job == {"status": "queued", "jobs": ["gh-d-label"]}
    assert follow_up.json() == {"status": "queued", "jobs": ["gh-d-follow-up"]}
    assert third == {"status": "queued", "jobs": ["gh-d-third"]}
    assert sorted(queued(redis_conn)) == ["gh-d-follow-up", "gh-d-label", "gh-d-third"]
    assert "empty case" not in caplog.text and "README" not in caplog.text


def test_the_same_comment_delivered_again_under_a_new_id_is_coalesced_and_the_answer_names_the_rule(
        send, label_and_comment_rules, redis_conn, caplog):
    text = "/pi fix-bug now also handle the empty case"
    send(commented(text), "d-c-first", "issue_comment")
    repeat = send(commented(text, comments=2), "d-c-repeat", "issue_comment")  # a rapid repeat: same text

    assert repeat.json() == {"status": "duplicate", "rule": "dedup-window", "jobs": ["gh-d-c-first"]}
    assert queued(redis_conn) == ["gh-d-c-first"]
    (key,) = [key.decode() for key in redis_conn.keys("pidispatch:dedup:*")]
    assert key.startswith("pidispatch:dedup:github:acme/web#7:fix-bug:c") and "empty" not in key
    # Re-label spam still coalesces with the labelled job, whatever comments came between.
    send(labelled(), "d-l1")
    relabel = send(labelled(labels=("pi", "bug")), "d-l2").json()
    assert relabel == {"status": "duplicate", "rule": "dedup-window", "jobs": ["gh-d-l1"]}
    # The forge's own redelivery of a delivery it sent before is answered by the delivery id.
    again = send(commented(text), "d-c-first", "issue_comment").json()
    assert again == {"status": "duplicate", "rule": "delivery-id", "jobs": ["gh-d-c-first"]}


def test_other_targets_and_other_flows_are_not_swallowed(send, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    rule(position=1, kind="github", on_type="label", label_any=["docs"], flow="write-docs")

    send(labelled(7), "d-7")
    send(labelled(8), "d-8")
    send(labelled(7, labels=("docs",)), "d-7-docs")

    assert sorted(queued(redis_conn)) == ["gh-d-7", "gh-d-7-docs", "gh-d-8"]


def test_the_same_name_on_another_forge_is_another_target(client, send, forges, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    rule(position=1, kind="forgejo", on_type="label", label_any=["pi"], flow="fix-bug")
    forges.forgejo_permission("acme/web", "maintainer-mia", "write")
    payload = load("forgejo/issues_label_updated.json")
    payload["repository"]["full_name"] = "acme/web"
    payload["issue"]["number"] = 7
    payload["issue"]["labels"] = [{"name": "pi"}]
    payload["sender"]["login"] = "maintainer-mia"
    body = dumps(payload)

    github = send(labelled(), "d-gh").json()
    forgejo = post(client, "forgejo", body, forgejo_headers(body, "issues", "d-fj")).json()

    assert (github, forgejo) == ({"status": "queued", "jobs": ["gh-d-gh"]}, {"status": "queued", "jobs": ["fj-d-fj"]})
    assert sorted(queued(redis_conn)) == ["fj-d-fj", "gh-d-gh"]


def test_the_window_is_configurable(send, redis_conn, settings):
    settings.PI_DEDUP_WINDOW_SECONDS = 0  # off
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    send(labelled(), "d-a")
    send(labelled(labels=("pi", "frontend")), "d-b")
    assert sorted(queued(redis_conn)) == ["gh-d-a", "gh-d-b"]


def test_semantic_keys(forges):
    from apps.receiver.dispatch import semantic_key
    from apps.worker.jobs import JobSpec

    def key(**fields):
        base = dict(job_id="gh-x", kind="github", repo="octo/repo", target_type="issue", number=42, flow="frontend-fix")
        return semantic_key(JobSpec(**{**base, **fields}))

    assert key() == "github:octo/repo#42:frontend-fix"
    assert key(kind="gitlab", repo="group/sub/proj", number=5) == "gitlab:group/sub/proj#5:frontend-fix"
    assert key(kind="gitlab", repo="group/sub/proj", number=5, target_type="pull_request") == \
        "gitlab:group/sub/proj!5:frontend-fix"
    assert key(kind="github", target_type="pull_request") == "github:octo/repo#42:frontend-fix"  # shared numbering
    assert key(kind="forgejo") == "forgejo:octo/repo#42:frontend-fix"  # the same name on another forge
    assert key(kind="azure", repo="Fabrikam/widgets", number=7, flow="fix") == "azure:Fabrikam/widgets#7:fix"
    assert key(flow="", command="summarise") == "github:octo/repo#42:cmd:summarise"
    assert key(trigger_type="issue", context={"matched": {"action": "closed"}}) == \
        "github:octo/repo#42:closed:frontend-fix"
    assert key(replica=1, replicas=2) == "github:octo/repo#42:frontend-fix:r1"
    commented = key(comment="@pi now the empty case")
    assert commented.startswith("github:octo/repo#42:frontend-fix:c") and len(commented.rsplit(":c", 1)[1]) == 16
    assert commented == key(comment="@pi now the empty case") != key(comment="@pi now the README")


@pytest.mark.django_db(transaction=True)
def test_concurrent_redeliveries_of_one_delivery_make_exactly_one_job(forges, redis_conn):
    """Eight threads POST the same delivery at once through real requests: one job, one inbox row."""
    from django.test import Client

    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    body = dumps(labelled())
    headers = github_headers(body, "issues", "d-race")
    answers, barrier = [], threading.Barrier(8, timeout=60)

    def deliver():
        barrier.wait()
        try:
            answers.append(post(Client(), "github", body, headers))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(answers) == 8 and all(answer.status_code == 202 for answer in answers), [a.content for a in answers]
    assert queued(redis_conn) == ["gh-d-race"]
    assert Delivery.objects.filter(delivery_id="d-race").count() == 1

    # A loser that answered "accepted" while the winner held the row spooled a copy: the replayer drops it.
    intake.replay_due()
    assert redis_conn.llen(intake.SPOOL_KEY) == 0 and queued(redis_conn) == ["gh-d-race"]
    assert Delivery.objects.filter(delivery_id="d-race").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_different_deliveries_for_one_target_make_one_job(forges, redis_conn):
    from django.test import Client

    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    body = dumps(labelled())
    barrier = threading.Barrier(6, timeout=60)
    answers = []

    def deliver(i):
        barrier.wait()
        try:
            answers.append(post(Client(), "github", body, github_headers(body, "issues", f"d-burst-{i}")).json())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(queued(redis_conn)) == 1
    assert sorted(answer["status"] for answer in answers) == ["duplicate"] * 5 + ["queued"]
    survivor = queued(redis_conn)[0]
    assert all(answer["jobs"] == [survivor] for answer in answers)


# --- replayed bodies --------------------------------------------------------------------------------------------

def replay_key(forge: str, body: bytes) -> str:
    return f"pidispatch:replay:{forge}:{hashlib.sha256(body).hexdigest()}"


def test_a_signed_body_sent_again_under_a_fresh_id_is_a_duplicate(client, forges, redis_conn, settings, caplog):
    """GitHub's signature does not cover the delivery id: a captured delivery resent with fresh ids would
    start a new paid job after every dedup window."""
    settings.PI_DEDUP_WINDOW_SECONDS = 0  # as if the window were long over
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    body = dumps(labelled())

    first = post(client, "github", body, github_headers(body, "issues", "d-orig")).json()
    with caplog.at_level("INFO"):
        replayed = post(client, "github", body, github_headers(body, "issues", "d-fresh"))

    assert first == {"status": "queued", "jobs": ["gh-d-orig"]}
    assert (replayed.status_code, replayed.json()) == (
        202, {"status": "duplicate", "rule": "replayed-body", "jobs": ["gh-d-orig"]})
    assert queued(redis_conn) == ["gh-d-orig"]
    row = Delivery.objects.get(delivery_id="d-fresh")
    assert (row.status, row.reason, row.job_ids, row.payload) == (
        DeliveryStatus.DUPLICATE, "replayed-body", ["gh-d-orig"], None)
    assert "job=gh-d-fresh surviving=gh-d-orig reason=replayed-body" in caplog.text
    assert 604_790_000 < redis_conn.pttl(replay_key("github", body)) <= 604_800_000  # 7 days

    # The forge's own redelivery keeps its id and is answered from the inbox, as before.
    again = post(client, "github", body, github_headers(body, "issues", "d-orig"))
    assert again.json() == {"status": "duplicate", "rule": "delivery-id", "jobs": ["gh-d-orig"]}
    # Any other body is another delivery.
    other = dumps(labelled(8))
    assert post(client, "github", other, github_headers(other, "issues", "d-other")).json()["status"] == "queued"


def test_a_replayed_body_finds_the_first_deliverys_jobs_whatever_the_rule_says_now(client, forges, redis_conn,
                                                                                   settings):
    settings.PI_DEDUP_WINDOW_SECONDS = 0
    trigger = rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug", replicas=2)
    body = dumps(labelled())

    assert post(client, "github", body, github_headers(body, "issues", "d-rp")).json()["jobs"] == \
        ["gh-d-rp-r1", "gh-d-rp-r2"]
    replayed = post(client, "github", body, github_headers(body, "issues", "d-rp2")).json()
    trigger.replicas = None
    trigger.save()
    unreplicated = post(client, "github", body, github_headers(body, "issues", "d-rp3")).json()

    assert replayed == unreplicated == {"status": "duplicate", "rule": "replayed-body", "jobs": ["gh-d-rp-r1"]}
    assert sorted(queued(redis_conn)) == ["gh-d-rp-r1", "gh-d-rp-r2"]


def test_the_replay_window_is_configurable(client, forges, redis_conn, settings):
    settings.PI_DEDUP_WINDOW_SECONDS = 0
    settings.PI_REPLAY_WINDOW_SECONDS = 0  # off
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    body = dumps(labelled())

    post(client, "github", body, github_headers(body, "issues", "d-w1"))
    post(client, "github", body, github_headers(body, "issues", "d-w2"))

    assert sorted(queued(redis_conn)) == ["gh-d-w1", "gh-d-w2"]
    assert redis_conn.keys("pidispatch:replay:*") == []


def test_an_ignored_body_claims_nothing(client, forges, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    body = dumps(labelled(labels=("docs",)))

    assert post(client, "github", body, github_headers(body, "issues", "d-ign")).json()["status"] == "ignored"
    assert redis_conn.keys("*") == []  # no digest claim, not even a round trip's worth of keys


# --- replicas ------------------------------------------------------------------------------------------------

def test_replicas_are_separate_jobs_with_separate_keys(send, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug", replicas=3)

    response = send(labelled(), "d-rep").json()

    assert response == {"status": "queued", "jobs": ["gh-d-rep-r1", "gh-d-rep-r2", "gh-d-rep-r3"]}
    for i in (1, 2, 3):
        spec = job_spec(redis_conn, f"gh-d-rep-r{i}")
        assert (spec["replica"], spec["replicas"]) == (i, 3)
        assert redis_conn.get(f"pidispatch:dedup:github:acme/web#7:fix-bug:r{i}") == f"gh-d-rep-r{i}".encode()


def test_a_replica_that_failed_halfway_converges_on_retry(client, forges, redis_conn, monkeypatch):
    """Redis dies after replica 1: the delivery stays pending; the retry makes replicas 2 and 3, not more."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from apps.receiver import dispatch, intake

    rule(position=0, kind="gitlab", on_type="label", label_any=["pi"], flow="fix-bug", replicas=3)
    forges.gitlab_member("4711", 1201, 40)
    real_enqueue, calls = dispatch.enqueue, []

    def flaky_enqueue(spec, queue, claims=()):
        calls.append(spec.job_id)
        if len(calls) == 2:
            raise RedisConnectionError("connection lost")
        return real_enqueue(spec, queue, claims)

    monkeypatch.setattr(dispatch, "enqueue", flaky_enqueue)
    body = dumps(load("gitlab/issue_update_labels.json"))
    response = post(client, "gitlab", body, gitlab_token_headers("Issue Hook", "idem-rep"))
    assert response.json() == {"status": "accepted"}
    assert queued(redis_conn) == ["gl-idem-rep-r1"]

    monkeypatch.setattr(dispatch, "enqueue", real_enqueue)
    answer = intake.replay(Delivery.objects.get(delivery_id="idem-rep"))

    assert answer.body == {"status": "queued", "jobs": ["gl-idem-rep-r2", "gl-idem-rep-r3", "gl-idem-rep-r1"]}
    assert sorted(queued(redis_conn)) == ["gl-idem-rep-r1", "gl-idem-rep-r2", "gl-idem-rep-r3"]


# --- routing -------------------------------------------------------------------------------------------------

def test_jobs_binding_a_host_capability_are_routed(send, redis_conn, monkeypatch):
    from apps.fleet import routing

    asked = []

    def queue_for(needs=frozenset(), job_id=""):
        asked.append(needs)
        return "pi-jobs@hostA"

    monkeypatch.setattr(routing, "queue_for", queue_for)
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug", secrets={"NPM_TOKEN": "npm/ci"},
         secrets_profile="vault", wait_for=[{"profile": "ci-green"}, {"after": "2026-01-01T00:00:00Z"}])
    rule(position=1, kind="github", on_type="label", label_any=["plain"], flow="fix-bug")

    routed = send(labelled(), "d-routed").json()
    plain = send(labelled(8, labels=("plain",)), "d-plain").json()

    assert asked == [frozenset({"secrets:vault", "wait:ci-green"})]  # plain jobs never ask the registry
    assert queued(redis_conn, "pi-jobs@hostA") == routed["jobs"]
    assert queued(redis_conn) == plain["jobs"]
    spec = job_spec(redis_conn, routed["jobs"][0], "pi-jobs@hostA")
    assert spec["secrets"] == {"NPM_TOKEN": "npm/ci"} and spec["secrets_profile"] == "vault"
    assert list(spec["wait_for"]) == [{"profile": "ci-green"}, {"after": "2026-01-01T00:00:00Z"}]


def test_routing_errors_fall_back_to_the_shared_queue(send, redis_conn, monkeypatch):
    from apps.fleet import routing

    def broken(needs=frozenset()):
        raise RuntimeError("registry unreadable")

    monkeypatch.setattr(routing, "queue_for", broken)
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug", secrets={"A": "b"},
         secrets_profile="vault")

    assert queued(redis_conn) == [] and send(labelled(), "d-fallback").status_code == 202
    assert queued(redis_conn) == ["gh-d-fallback"]


def test_every_execution_field_of_the_rule_reaches_the_job(send, redis_conn):
    rule(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug", image="registry/pi:2",
         instructions="Keep the change small.", provider="anthropic", model="claude-sonnet-4",
         max_turns=12, exclude_tools=["bash", "write"], resume=True)

    spec = job_spec(redis_conn, send(labelled(), "d-fields").json()["jobs"][0])

    assert {k: spec[k] for k in ("image", "instructions", "provider", "model", "max_turns", "exclude_tools",
                                 "resume", "once")} == {
        "image": "registry/pi:2", "instructions": "Keep the change small.", "provider": "anthropic",
        "model": "claude-sonnet-4", "max_turns": 12, "exclude_tools": ("bash", "write"), "resume": True,
        "once": False}
    assert set(spec["context"]) == {"event", "action", "deliveryId", "sender", "matched"}  # no execution knobs
