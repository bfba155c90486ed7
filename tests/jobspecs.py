"""Building and enqueueing JobSpecs directly, for tests of the worker side, and finding their texts in Redis."""

import contextlib
import zlib

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


MARKER = "PRIVATE-TEXT-4be1"


def marked_spec(job_id: str, body: str = "", **fields) -> JobSpec:
    """A forge job each of whose container-only fields carries MARKER (the body after `body`'s directives)."""
    return forge_spec(job_id, title=f"{MARKER} title", body=f"{body} {MARKER} body".strip(),
                      comment=f"{MARKER} comment", instructions=f"{MARKER} instructions",
                      context={"event": "issue_comment", "comment": {"body": f"{MARKER} comment"}}, **fields)


def keys_holding(redis, text: str = MARKER) -> list[str]:
    """Every Redis key whose value holds `text`, zlib-compressed values (RQ's job data) included."""
    found = []
    for key in redis.scan_iter(count=1000):
        kind = redis.type(key).decode()
        values = {"string": lambda key=key: [redis.get(key)], "hash": lambda key=key: redis.hvals(key),
                  "list": lambda key=key: redis.lrange(key, 0, -1), "set": lambda key=key: redis.smembers(key),
                  "zset": lambda key=key: redis.zrange(key, 0, -1),
                  "stream": lambda key=key: [v for _, entry in redis.xrange(key) for v in entry.values()]}[kind]()
        for value in values:
            with contextlib.suppress(zlib.error):
                value = zlib.decompress(value)
            if text.encode() in value:
                found.append(key.decode())
                break
    return sorted(found)
