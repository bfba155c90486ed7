"""Building and enqueueing JobSpecs directly, for tests of the worker side."""

from apps.worker.jobs import JobSpec, enqueue


def forge_spec(job_id: str, body: str = "Please fix it.", **fields) -> JobSpec:
    values = dict(kind="github", repo="acme/web", target_type="issue", number=7, flow="fix-bug",
                  title="A bug", body=body)
    values.update(fields)
    return JobSpec(job_id=job_id, **values)


def local_spec(job_id: str, folder: str, task: str = "Tidy up.", **fields) -> JobSpec:
    values = dict(kind="local", folder=folder, target_type="local", flow="tidy", task=task)
    values.update(fields)
    return JobSpec(job_id=job_id, **values)


def enqueue_spec(spec: JobSpec, queue: str = "pi-jobs") -> str:
    assert enqueue(spec, queue).created, f"{spec.job_id} already exists"
    return spec.job_id
