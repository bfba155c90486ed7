"""The host budget (issue 51): each job has a size, each host a budget, each project a share of it and a floor of
jobs; a job starts only when it fits, a big one is not starved by small ones, and one that never fits is refused
saying why. The ledger's decisions on the real Redis; the budget from the real engine's totals; real workers, the
demo image and the engine for what runs side by side."""

import subprocess
import sys
import time
import uuid

import docker
import pytest
from django.conf import settings
from django.test import override_settings
from rq import Queue

from apps.worker.gates import host_budget
from apps.worker.gates.host_budget import BudgetInvalid, HostBudget, JobSize
from apps.worker.models import Outcome, Project, Run, ScopedLimit
from tests.conftest import ROOT, wait_for
from tests.jobspecs import enqueue_spec, forge_spec, local_spec
from tests.process_support import ContainerLifetimes

BUDGET = HostBudget(memory_mib=1024, cpu_centi=400)
SMALL, DEFAULT, LARGE = JobSize(256, 100), JobSize(512, 100), JobSize(1024, 100)
T0 = 1_800_000_000_000  # ms


@pytest.fixture
def host(redis_conn):
    """A host of its own with an empty ledger, listed from the engine (which runs no job container of it)."""
    name = f"host{uuid.uuid4().hex[:6]}"
    assert host_budget.list_survivors(redis_conn, name) == 0
    return name


def waiting_job(redis_conn, job_id: str, status: str = "scheduled") -> str:
    """An RQ job as a deferred one is: a waiter whose line place is checked against it."""
    Queue("pi-jobs", connection=redis_conn).enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id=job_id)
    redis_conn.hset(f"rq:job:{job_id}", "status", status)
    return job_id


def ask(redis_conn, host, job_id, size, *, at=0, project="", min_jobs=None, share=None, budget=BUDGET):
    """One decision for the job as its gate asks it (its RQ job deferred until then, started once admitted)."""
    if not redis_conn.exists(f"rq:job:{job_id}"):
        waiting_job(redis_conn, job_id)
    decision = host_budget.decide(redis_conn, host, job_id=job_id, holder=f"{host}#{job_id}", size=size,
                                  project=project, min_jobs=min_jobs, budget=budget, share_percent=share,
                                  now_ms=T0 + at * 1000)
    if decision.admitted:
        redis_conn.hset(f"rq:job:{job_id}", "status", "started")
    return decision


def end(redis_conn, host, job_id):
    host_budget.release(redis_conn, host, f"{host}#{job_id}")
    redis_conn.hset(f"rq:job:{job_id}", "status", "finished")


# --- the ledger -------------------------------------------------------------------------------------------------

def test_jobs_start_while_their_sizes_fit_and_the_next_waits(redis_conn, host):
    assert ask(redis_conn, host, "a", DEFAULT).admitted
    assert ask(redis_conn, host, "b", DEFAULT).admitted
    waited = ask(redis_conn, host, "c", SMALL, at=1)
    assert (waited.admitted, waited.bound) == (False, "host")
    end(redis_conn, host, "a")
    assert ask(redis_conn, host, "c", SMALL, at=2).admitted
    usage = host_budget.usage(redis_conn, host)
    assert (usage.memory_mib, usage.jobs, usage.waiting) == (512 + 256, 2, 0)


def test_the_oldest_waiter_keeps_its_room_so_small_jobs_do_not_starve_a_big_one(redis_conn, host):
    assert ask(redis_conn, host, "s1", DEFAULT).admitted
    assert ask(redis_conn, host, "s2", DEFAULT).admitted
    assert not ask(redis_conn, host, "big", LARGE, at=1).admitted

    end(redis_conn, host, "s1")
    # Room for a small job now, but the big one's hold is ranked above it: it waits behind.
    behind = ask(redis_conn, host, "s3", SMALL, at=2)
    assert (behind.admitted, behind.ahead) == (False, 1)
    end(redis_conn, host, "s2")
    assert ask(redis_conn, host, "big", LARGE, at=3).admitted
    end(redis_conn, host, "big")
    assert ask(redis_conn, host, "s3", SMALL, at=4).admitted


def test_a_project_below_its_floor_goes_before_an_older_waiter(redis_conn, host):
    assert ask(redis_conn, host, "beta-1", DEFAULT, project="beta").admitted
    assert not ask(redis_conn, host, "beta-2", LARGE, project="beta", at=1).admitted  # the oldest waiter: a hold
    behind = ask(redis_conn, host, "alpha-1", DEFAULT, project="alpha", at=2)
    assert (behind.admitted, behind.ahead) == (False, 1)  # without a floor it waits behind the older hold
    # With minJobs 1 alpha, which runs nothing here, holds room for its oldest waiter first.
    assert ask(redis_conn, host, "alpha-1", DEFAULT, project="alpha", min_jobs=1, at=3).admitted
    end(redis_conn, host, "beta-1")
    assert not ask(redis_conn, host, "beta-2", LARGE, project="beta", at=4).admitted
    end(redis_conn, host, "alpha-1")
    assert ask(redis_conn, host, "beta-2", LARGE, project="beta", at=5).admitted


def test_a_project_stays_within_its_share_while_others_still_start(redis_conn, host):
    assert ask(redis_conn, host, "alpha-1", DEFAULT, project="alpha", share=50).admitted
    over = ask(redis_conn, host, "alpha-2", SMALL, project="alpha", share=50, at=1)
    assert (over.admitted, over.bound) == (False, "share")
    assert ask(redis_conn, host, "beta-1", SMALL, project="beta", at=2).admitted


def test_a_waiter_another_gate_holds_back_gives_up_its_room_and_keeps_its_place(redis_conn, host):
    assert ask(redis_conn, host, "s1", DEFAULT).admitted
    big = "big"
    assert not ask(redis_conn, host, big, LARGE, at=1).admitted
    host_budget.suspend(redis_conn, host, big)  # quiet hours, say
    assert ask(redis_conn, host, "s2", SMALL, at=2).admitted  # its room is not held meanwhile
    later = "later"
    assert ask(redis_conn, host, later, DEFAULT, at=3).ahead == 0  # the oldest live waiter now
    assert ask(redis_conn, host, big, LARGE, at=4).ahead == 0  # back at its old place in line
    assert ask(redis_conn, host, later, DEFAULT, at=5).ahead == 1


def test_a_waiter_that_is_no_longer_waiting_is_dropped_after_a_while(redis_conn, host):
    assert ask(redis_conn, host, "s1", DEFAULT).admitted
    assert not ask(redis_conn, host, "cancelled", LARGE, at=1).admitted
    redis_conn.hset("rq:job:cancelled", "status", "canceled")
    assert not ask(redis_conn, host, "s2", SMALL, at=2).admitted  # its hold is fresh: not checked yet
    later = host_budget.VERIFY_AFTER_MS // 1000 + 3
    assert ask(redis_conn, host, "s2", SMALL, at=later).admitted
    assert host_budget.usage(redis_conn, host).waiting == 0


def test_a_holder_whose_attempt_no_longer_runs_is_swept_when_a_job_would_wait(redis_conn, host):
    assert ask(redis_conn, host, "killed", LARGE).admitted
    assert not ask(redis_conn, host, "next", DEFAULT, at=1).admitted
    redis_conn.hset("rq:job:killed", "status", "failed")  # its work horse was killed and the job settled
    assert ask(redis_conn, host, "next", DEFAULT, at=2).admitted


def test_nothing_is_admitted_before_the_engines_surviving_containers_are_counted(redis_conn, job_containers):
    """A Redis that lost its data: the host's running job container (768 MiB on its label) is counted first."""
    name = f"host{uuid.uuid4().hex[:6]}"
    survivor_job = waiting_job(redis_conn, "survivor", status="started")
    client = docker.from_env()
    survivor = client.containers.run(
        settings.PI_JOB_IMAGE, ["sleep", "60"], name=f"pi-job-{survivor_job}-{name}", detach=True, entrypoint=[],
        labels={"pidispatch.job": survivor_job, "pidispatch.host": name, **JobSize(768, 100).labels("alpha")})
    try:
        waited = ask(redis_conn, name, "after", DEFAULT)
        assert (waited.admitted, waited.bound) == (False, "host")  # 768 + 512 > 1024
        usage = host_budget.usage(redis_conn, name)
        assert (usage.memory_mib, usage.by_project) == (768, {"alpha": (768, 100, 1)})
    finally:
        survivor.remove(force=True)


# --- the budget ---------------------------------------------------------------------------------------------------

@override_settings(PI_JOB_MEMORY="4g", PI_JOB_CPUS=2.0, PI_HOST_MEMORY_BUDGET="auto", PI_HOST_CPU_BUDGET="auto",
                   PI_HOST_RESERVE_MEMORY="auto", PI_HOST_RESERVE_CPUS="auto")
def test_auto_is_what_the_engine_reports_less_the_reserve_never_below_one_default_job():
    assert host_budget.compute_budget((32 * 1024, 800)) == HostBudget(32 * 1024 - 3276, 700, 32 * 1024, 800)
    assert host_budget.compute_budget((5 * 1024, 200)).memory_mib == 4096  # 5g less 1g: one 4g job, no less
    with pytest.raises(BudgetInvalid, match="engine reports 1g, less than one default job"):
        host_budget.compute_budget((1024, 800))
    engine = host_budget.engine_totals()  # the real engine answers
    assert engine[0] > 0 and engine[1] >= 100


@override_settings(PI_JOB_MEMORY="512m", PI_JOB_CPUS=1.0, PI_HOST_MEMORY_BUDGET="1g", PI_HOST_CPU_BUDGET="off")
def test_an_amount_is_taken_as_it_is_and_off_bounds_nothing():
    assert host_budget.compute_budget() == HostBudget(1024, None)
    with override_settings(PI_HOST_MEMORY_BUDGET="256m"), pytest.raises(BudgetInvalid, match="below one default"):
        host_budget.compute_budget()
    with override_settings(PI_HOST_CPU_BUDGET="lots"), pytest.raises(BudgetInvalid, match="not auto, off or an"):
        host_budget.compute_budget()


def test_a_worker_whose_budget_holds_no_default_job_refuses_to_start_saying_why(worker_env):
    result = subprocess.run([sys.executable, "manage.py", "rqworker", "pi-jobs", "--burst"], cwd=ROOT,
                            env={**worker_env, "PI_HOST_MEMORY_BUDGET": "128m"}, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "PI_HOST_MEMORY_BUDGET=128m is below one default job (256m)" in result.stderr


# --- real workers and the engine ----------------------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


def most_at_once(spans: dict, size_of) -> int:
    """The largest sum of sizes of containers running at one instant (at each start, what runs then)."""
    return max(sum(size_of(other) for other, (s, f) in spans.items() if s <= start < f)
               for start, _ in spans.values())


def started_order(lifetimes: ContainerLifetimes) -> list[str]:
    return [job for job, (start, _) in sorted(lifetimes.intervals().items(), key=lambda item: item[1][0])]


@pytestmark_db
def test_a_large_job_starts_within_two_small_jobs_time_in_a_stream_of_small_ones(start_worker, redis_conn):
    """A budget of two default jobs (2 x 256 MiB), three worker processes, small jobs arriving all along: the large
    job (a project of 512 MiB) holds its room and starts as soon as the two small ones before it end."""
    Project.objects.create(slug="heavy", members=["github:acme/heavy"])
    ScopedLimit.objects.create(scope="project:heavy", memory="512m")
    lifetimes = ContainerLifetimes()
    start_worker("pi-jobs", pool=3, name="budget",
                 env={"PI_HOST_MEMORY_BUDGET": "512m", "PI_HOST_BUDGET_RECHECK_SECONDS": "1"})
    small = 3
    first = [enqueue_spec(forge_spec(f"gh-small-{i}", number=40 + i, body=f"fake-agent:sleep={small}"))
             for i in range(2)]
    wait_for(lambda: len(lifetimes.started()) == 2, timeout=90, what="the first two small jobs' containers")
    enqueued = time.time()
    large = enqueue_spec(forge_spec("gh-large", repo="acme/heavy", number=7, body="fake-agent:sleep=1"))
    stream = []
    for i in range(4):  # small jobs keep arriving while the large one waits
        stream.append(enqueue_spec(forge_spec(f"gh-stream-{i}", number=50 + i, body=f"fake-agent:sleep={small}")))
        time.sleep(0.5)

    jobs = [*first, large, *stream]
    wait_for(lambda: Run.objects.filter(job_id__in=jobs, outcome=Outcome.COMPLETED).count() == len(jobs),
             timeout=180, interval=0.5, what="every run completed")
    wait_for(lambda: len(lifetimes.intervals()) == len(jobs), timeout=10, what="container events")
    lifetimes.close()
    spans = lifetimes.intervals()
    assert started_order(lifetimes)[2] == large  # no job of the stream passed it
    assert spans[large][0] / 1e9 - enqueued < 2 * small + 3  # within two small jobs' time (and a recheck)
    assert most_at_once(spans, lambda job: 512 if job == large else 256) <= 512  # never past the budget
    run = Run.objects.get(job_id=large)
    assert (run.job_memory_mib, run.size_source) == (512, "project")
    assert Run.objects.get(job_id=first[0]).job_memory_mib == 256


@pytestmark_db
def test_a_project_keeps_within_its_share_while_another_projects_jobs_run_beside(start_worker, redis_conn):
    """A budget of 1 GiB; alpha (512 MiB jobs) may use half of it, beta (256 MiB) keeps room for one job: alpha's
    jobs run one at a time, beta's beside them."""
    Project.objects.create(slug="alpha", members=["github:acme/alpha"])
    Project.objects.create(slug="beta", members=["github:acme/beta"])
    ScopedLimit.objects.create(scope="project:alpha", memory="512m", host_share=50)
    ScopedLimit.objects.create(scope="project:beta", memory="512m", min_jobs=1)
    lifetimes = ContainerLifetimes()
    start_worker("pi-jobs", pool=3, name="shares",
                 env={"PI_HOST_MEMORY_BUDGET": "1g", "PI_HOST_BUDGET_RECHECK_SECONDS": "1"})
    alpha = [enqueue_spec(forge_spec(f"gh-alpha-{i}", repo="acme/alpha", number=60 + i, body="fake-agent:sleep=2"))
             for i in range(3)]
    beta = [enqueue_spec(forge_spec(f"gh-beta-{i}", repo="acme/beta", number=70 + i, body="fake-agent:sleep=2"))
            for i in range(2)]

    jobs = alpha + beta
    wait_for(lambda: Run.objects.filter(job_id__in=jobs, outcome=Outcome.COMPLETED).count() == len(jobs),
             timeout=180, interval=0.5, what="every run completed")
    wait_for(lambda: len(lifetimes.intervals()) == len(jobs), timeout=10, what="container events")
    lifetimes.close()
    spans = lifetimes.intervals()

    def overlap(first, second):
        return spans[first][0] < spans[second][1] and spans[second][0] < spans[first][1]

    assert not any(overlap(a, b) for a in alpha for b in alpha if a < b)  # alpha's share holds one of its jobs
    assert any(overlap(a, b) for a in alpha for b in beta)  # beta's ran beside them
    assert most_at_once(spans, lambda job: 512) <= 1024


@pytestmark_db
def test_a_job_that_can_never_fit_is_refused_saying_why(run_worker):
    Project.objects.create(slug="huge", members=["github:acme/huge", "/srv/nowhere"])
    ScopedLimit.objects.create(scope="project:huge", memory="2g")
    ScopedLimit.objects.create(scope="project:other", memory="512m", host_share=10)
    Project.objects.create(slug="other", members=["github:acme/other"])
    on_host_queue = enqueue_spec(forge_spec("gh-huge", repo="acme/huge"), "pi-jobs@hostH")
    shared = enqueue_spec(forge_spec("gh-huge-shared", repo="acme/huge", number=2))
    local = enqueue_spec(local_spec("local-huge", "/srv/nowhere"), "pi-jobs@hostH")
    share = enqueue_spec(forge_spec("gh-over-share", repo="acme/other", number=3), "pi-jobs@hostH")

    run_worker("pi-jobs", "pi-jobs@hostH", env_overrides={"PI_WORKER_NAME": "hostH", "PI_HOST_MEMORY_BUDGET": "1g",
                                                         "PI_FLEET_FIT_CONFIRM_SECONDS": "1"})

    reasons = dict(Run.objects.filter(job_id__in=[on_host_queue, local, share]).values_list("job_id", "reason"))
    assert reasons == {on_host_queue: "job-size-exceeds-host", local: "job-size-exceeds-host",
                       share: "job-size-exceeds-share"}
    # From the shared queue another host might hold it: refused once two registry reads a second apart agree none
    # does (this host is the only live one).
    deadline = time.time() + 60
    while not Run.objects.filter(job_id=shared).exists():
        assert time.time() < deadline, "the shared job was never refused"
        time.sleep(1)
        run_worker("pi-jobs", env_overrides={"PI_WORKER_NAME": "hostH", "PI_HOST_MEMORY_BUDGET": "1g",
                                             "PI_FLEET_FIT_CONFIRM_SECONDS": "1"})
    run = Run.objects.get(job_id=shared)
    assert (run.outcome, run.reason) == (Outcome.POLICY, "job-size-exceeds-fleet")


@pytestmark_db
def test_the_fleet_panel_and_metrics_show_each_hosts_budget_and_what_its_projects_use(start_worker, redis_conn,
                                                                                      admin_client, client,
                                                                                      job_containers):
    from prometheus_client.parser import text_string_to_metric_families

    Project.objects.create(slug="storefront", members=["github:acme/web"])
    ScopedLimit.objects.create(scope="project:storefront", memory="512m")
    start_worker("pi-jobs", "pi-jobs@hostP", name="hostP",
                 env={"PI_WORKER_NAME": "hostP", "PI_HOST_MEMORY_BUDGET": "1g", "PI_HOST_CPU_BUDGET": "4"})
    enqueue_spec(forge_spec("gh-shown", body="fake-agent:sleep=30"), "pi-jobs@hostP")
    wait_for(lambda: job_containers("hostP").get("gh-shown"), timeout=90, what="the job's container")

    page = admin_client.get("/admin/fleet/fleetpanel/").content.decode()
    row = page.split('data-host="hostP"')[1].split("</tr>")[0]
    assert "512m of 1g · 2 of 4 CPUs · storefront 512m (1 job)" in row
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(client.get("/metrics").content.decode())
               for s in family.samples}
    assert samples[("pidispatch_host_budget", (("host", "hostP"), ("resource", "memory")))] == 1024 ** 3
    assert samples[("pidispatch_host_budget_in_use",
                    (("host", "hostP"), ("project", "storefront"), ("resource", "memory")))] == 512 * 1024 ** 2


def test_doctor_says_the_budget_beside_what_the_engine_reports_and_fails_one_that_holds_no_job(settings):
    from apps.worker import doctor

    settings.PI_JOB_MEMORY, settings.PI_JOB_CPUS = "256m", 1.0
    settings.PI_HOST_MEMORY_BUDGET, settings.PI_HOST_CPU_BUDGET = "auto", "off"
    (found,) = doctor.check_host_budget()
    memory, _ = host_budget.engine_totals()
    assert found.status == doctor.OK and f"(the engine reports {memory} MiB" in found.finding
    assert "CPUs off" not in found.finding and ", off" in found.finding
    settings.PI_HOST_MEMORY_BUDGET = "128m"
    (found,) = doctor.check_host_budget()
    assert found.status == doctor.FAIL and "PI_HOST_MEMORY_BUDGET=128m is below one default job" in found.finding
