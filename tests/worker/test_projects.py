"""Projects (issue 29 §4): a job is stamped with its project when it is enqueued, its run records it, and the
project's `project:<id>` scoped-limit row caps its members together (job counts `project-cap`, dollars
`dollar-cap`) and sizes their containers (v3 memory/cpus); `model:<provider>/<model>` rows hold the dollars of
every job that may call the model. Real Redis; real worker processes and the demo image for the container."""

import threading
from datetime import UTC, datetime
from decimal import Decimal

import docker
import pytest

from apps.worker.gates import budget, runtime_settings
from apps.worker.gates.steps import job_models
from apps.worker.models import Outcome, Project, Run, ScopedLimit
from apps.worker.sandbox import providers
from tests.conftest import joined, wait_for
from tests.jobspecs import enqueue_spec, forge_spec, local_spec
from tests.process_support import ContainerLifetimes, assert_no_overlap

pytestmark = pytest.mark.django_db(transaction=True)
NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


@pytest.fixture
def storefront():
    return Project.objects.create(slug="storefront", members=["github:acme/web", "/srv/code/storefront"])


def used_and_held(redis, scope: str, window: str = "day", now=NOW) -> tuple[int, int]:
    key = budget.usd_window_keys(f"s:{budget.scope_hash(scope)}", now)[window]
    used, held = redis.hmget(key, "used", "held")
    return int(used or 0), int(held or 0)


# --- stamping ----------------------------------------------------------------------------------------------

def test_a_job_is_stamped_with_its_project_when_it_is_enqueued(storefront, redis_conn):
    from apps.worker.jobs import project_of

    assert project_of(forge_spec("gh-p1")) == "storefront"
    assert project_of(forge_spec("gl-p2", kind="gitlab")) == ""  # members are forge-qualified: github only
    assert project_of(local_spec("local-p3", "/srv/code/storefront/")) == "storefront"  # normalised
    assert project_of(forge_spec("gh-p4", repo="acme/other")) == ""

    enqueue_spec(forge_spec("gh-p5"))
    payload = redis_conn.hgetall("rq:job:gh-p5")
    assert payload  # the stamp travels in the payload: moving the repository later does not move this job
    from rq.job import Job

    assert Job.fetch("gh-p5", connection=redis_conn).args[0]["project"] == "storefront"
    enqueue_spec(forge_spec("gh-p6", repo="acme/other"))
    assert "project" not in Job.fetch("gh-p6", connection=redis_conn).args[0]  # as older workers read it


# --- job counts and dollars --------------------------------------------------------------------------------

def test_a_projects_job_count_refuses_project_cap_and_gives_the_narrower_slot_back(storefront, redis_conn):
    ScopedLimit.objects.create(scope="acme/web", day=5)
    ScopedLimit.objects.create(scope="project:storefront", day=1)
    caps = runtime_settings.current()
    spec = forge_spec("gh-pc", project="storefront")
    rows = budget.rows_for(spec)
    assert (rows.scope.scope, rows.project.scope) == ("acme/web", "project:storefront")

    budget.reserve(redis_conn, rows, caps, NOW)
    with pytest.raises(budget.CapRefusal) as refused:
        budget.reserve(redis_conn, rows, caps, NOW)
    assert (refused.value.reason, refused.value.budget_reserved) == ("project-cap", False)
    repo_day = budget.window_keys(f"s:{budget.scope_hash('acme/web')}", NOW)["day"]
    assert int(redis_conn.get(repo_day)) == 1  # the refused attempt's repository slot was given back
    # A job of no project is not counted there.
    budget.reserve(redis_conn, budget.rows_for(forge_spec("gh-pc-other", repo="acme/other")), caps, NOW)


def test_a_job_that_may_call_any_model_holds_in_every_model_row(redis_conn, settings):
    settings.PI_MAX_COST_USD = "1"
    ScopedLimit.objects.create(scope="model:anthropic/claude-sonnet-4", day_usd=Decimal("10"))
    ScopedLimit.objects.create(scope="model:openai/gpt-4.1", day_usd=Decimal("10"))
    runtime = runtime_settings.current()
    spec = forge_spec("gh-any-model")
    rows = budget.rows_for(spec)

    budget.reserve_dollars(redis_conn, spec, rows.calling(None), runtime, NOW)
    assert used_and_held(redis_conn, "model:anthropic/claude-sonnet-4") == (0, 1_000_000)
    assert used_and_held(redis_conn, "model:openai/gpt-4.1") == (0, 1_000_000)

    named = forge_spec("gh-one-model")
    budget.reserve_dollars(redis_conn, named, rows.calling(("OpenAI/GPT-4.1",)), runtime, NOW)
    assert used_and_held(redis_conn, "model:anthropic/claude-sonnet-4") == (0, 1_000_000)
    assert used_and_held(redis_conn, "model:openai/gpt-4.1") == (0, 2_000_000)


def test_the_jobs_models_come_from_its_provider_and_model(settings):
    settings.PI_MODEL = ""
    own = providers.Upstream("local-llm", "openai-completions", "http://127.0.0.1:9/v1", builtin=False)
    assert job_models(forge_spec("gh-m0"), own) is None  # no model named: it may call any
    assert job_models(forge_spec("gh-m1", model="Qwen3-8B"), own) == ("local-llm/Qwen3-8B",)
    settings.PI_MODEL = "qwen3-8b"
    assert job_models(forge_spec("gh-m2"), own) == ("local-llm/qwen3-8b",)  # the deployment's model
    # A builtin provider's fuzzy pattern (pi resolves `sonnet` itself) names no one model: every row applies.
    assert job_models(forge_spec("gh-m3", model="sonnet"), providers.upstream("anthropic")) is None


def test_a_model_rows_dollar_window_refuses_dollar_cap(redis_conn, settings):
    settings.PI_MAX_COST_USD = "1"
    ScopedLimit.objects.create(scope="model:fake/fake-1", day_usd=Decimal("1.5"))
    runtime = runtime_settings.current()
    rows = budget.rows_for(forge_spec("gh-mw"))
    budget.reserve_dollars(redis_conn, forge_spec("gh-mw1"), rows, runtime, NOW)
    with pytest.raises(budget.DollarRefusal) as refused:
        budget.reserve_dollars(redis_conn, forge_spec("gh-mw2"), rows, runtime, NOW)
    assert refused.value.reason == "dollar-cap" and refused.value.window.scope == "model:fake/fake-1"


# --- a real worker ---------------------------------------------------------------------------------------------

@pytest.mark.docker
def test_a_projects_dollar_window_refuses_the_second_job_and_its_size_reaches_the_container(
        storefront, run_worker, redis_conn, job_containers):
    """$1 a job against the project's $1.50 a day: the first member's job runs (in a 512m, half-CPU container),
    the second member's is refused `dollar-cap`; a repository outside the project runs at the deployment's size."""
    ScopedLimit.objects.create(scope="project:storefront", day_usd=Decimal("1.5"), memory="512m", cpus=Decimal("0.5"))
    first = enqueue_spec(forge_spec("gh-proj-1", body="fake-agent:sleep=2"))
    second = enqueue_spec(forge_spec("gh-proj-2", number=8))
    outside = enqueue_spec(forge_spec("gh-proj-3", repo="acme/other", body="fake-agent:sleep=2"))
    engine = docker.from_env()
    seen = {}

    def inspect_while_running(job_id):
        container = wait_for(lambda: next(iter(engine.containers.list(
            all=True, filters={"label": f"pidispatch.job={job_id}"}, ignore_removed=True)), None),
            timeout=90, what=f"the container of {job_id}")
        seen[job_id] = container.attrs["HostConfig"]

    watchers = [threading.Thread(target=inspect_while_running, args=(job_id,)) for job_id in (first, outside)]
    for watcher in watchers:
        watcher.start()
    run_worker("pi-jobs", env_overrides={"PI_MAX_COST_USD": "1"})
    for watcher in watchers:
        joined(watcher, 100, "the container watchers")

    ran, refused, other = (Run.objects.get(job_id=job_id) for job_id in (first, second, outside))
    assert (ran.outcome, ran.project, ran.dollars_reserved) == (Outcome.COMPLETED, "storefront", Decimal("1"))
    assert (refused.outcome, refused.reason, refused.project) == (Outcome.POLICY, "dollar-cap", "storefront")
    assert (other.outcome, other.project) == (Outcome.COMPLETED, "")
    today = datetime.now(UTC)
    assert used_and_held(redis_conn, "project:storefront", now=today) == (1_000_000, 0)

    assert seen[first]["Memory"] == 512 * 1024**2 and seen[first]["NanoCpus"] == 5 * 10**8
    assert seen[outside]["Memory"] == 256 * 1024**2 and seen[outside]["NanoCpus"] == 2 * 10**9  # the test env's


@pytest.mark.docker
def test_a_projects_concurrent_one_holds_its_members_to_one_at_a_time(storefront, start_worker):
    """Two repositories of one project, each with no limit of its own: `concurrent: 1` on the project row makes
    them wait for each other (deferred, never refused) across two worker processes."""
    storefront.members = ["github:acme/web", "github:acme/other"]
    storefront.save()
    ScopedLimit.objects.create(scope="project:storefront", concurrent=1)
    lifetimes = ContainerLifetimes()
    jobs = [enqueue_spec(forge_spec("gh-pcc1", body="fake-agent:sleep=2")),
            enqueue_spec(forge_spec("gh-pcc2", repo="acme/other", body="fake-agent:sleep=2")),
            enqueue_spec(forge_spec("gh-pcc3", number=9, body="fake-agent:sleep=2"))]

    for _ in range(2):
        start_worker("pi-jobs", env={"PI_SCOPE_BUSY_RECHECK_SECONDS": "1"})

    wait_for(lambda: Run.objects.count() == 3, timeout=120, interval=0.5, what="three runs")
    wait_for(lambda: len(lifetimes.intervals()) == 3, timeout=10, what="container events")
    lifetimes.close()
    assert set(Run.objects.values_list("outcome", "project")) == {(Outcome.COMPLETED, "storefront")}
    assert set(lifetimes.intervals()) == set(jobs)
    assert_no_overlap(lifetimes.intervals())
