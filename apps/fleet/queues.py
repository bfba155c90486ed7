"""Queue names (DESIGN section 4): the shared `pi-jobs` and one `pi-jobs@<host>` per declared host.

Pure Python on purpose: settings import it, and the fleet commands must work with nothing but Redis.
"""

import re

SHARED_QUEUE = "pi-jobs"
HOST_QUEUE_SEPARATOR = "@"
HOST_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def is_valid_host_name(name: str) -> bool:
    return isinstance(name, str) and bool(HOST_NAME_PATTERN.fullmatch(name))


def host_queue(host: str) -> str:
    if not is_valid_host_name(host):
        raise ValueError(f"invalid worker name {host!r}: must match {HOST_NAME_PATTERN.pattern}")
    return f"{SHARED_QUEUE}{HOST_QUEUE_SEPARATOR}{host}"


def host_of_queue(queue_name: str) -> str | None:
    """The host a host queue belongs to; None for the shared queue or anything that is not ours."""
    prefix = SHARED_QUEUE + HOST_QUEUE_SEPARATOR
    if not queue_name.startswith(prefix):
        return None
    host = queue_name[len(prefix):]
    return host if is_valid_host_name(host) else None


def is_dispatch_queue(queue_name: str) -> bool:
    return queue_name == SHARED_QUEUE or host_of_queue(queue_name) is not None


class QueueConfigMap(dict):
    """`RQ_QUEUES` that also answers for every valid host queue.

    django-rq looks queues up by name in `RQ_QUEUES`; host names are not known when settings load, so a
    missing `pi-jobs@<host>` resolves to the shared queue's connection instead of a KeyError. Listing
    (`items()`) shows only the shared queue, which is what the django-rq views should enumerate.
    """

    def __init__(self, shared_config: dict):
        super().__init__({SHARED_QUEUE: shared_config})

    def __missing__(self, name):
        if isinstance(name, str) and host_of_queue(name) is not None:
            return self[SHARED_QUEUE]
        raise KeyError(
            f"{name!r} is not a pidispatch queue: workers drain {SHARED_QUEUE} and {SHARED_QUEUE}@<worker name>, "
            f"the name matching {HOST_NAME_PATTERN.pattern}"
        )

    def __contains__(self, name):
        return super().__contains__(name) or (isinstance(name, str) and host_of_queue(name) is not None)

    def get(self, name, default=None):
        return self[name] if name in self else default  # noqa: SIM401 (this is get(): self.get would recurse)
