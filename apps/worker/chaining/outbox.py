"""Reading a run's `/outbox`, written by the agent, so hostile: nothing in it is followed, opened blocking, or read
past its bound, and each file is judged on its own (one bad request never hides the others).

A request is `request-<n>.json` (n: 1 to 6 digits), read in numeric order: a regular file (`chain-not-regular-file`:
a link, a fifo, a folder), at most MAX_REQUEST_BYTES (`chain-oversize`), a JSON object (`chain-parse-error`) without
a `command` (`chain-command-refused`), whose `flow` is a skill name (`chain-bad-flow-name`) and whose `task` is text
(`chain-bad-task`); one that cannot be opened or read otherwise is `chain-unreadable`. Past the first `max_requests`
request files the rest are refused unread (`chain-count-cap`). Other names are ignored. The folder's listing is
bounded too: a run that left more than MAX_ENTRIES entries has its requests refused at once (`chain-outbox-flooded`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from apps.worker.name_patterns import FLOW_PATTERN

REQUEST_NAME = re.compile(r"^request-([0-9]{1,6})\.json$")
MAX_REQUEST_BYTES = 4096
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Request:
    name: str  # request-<n>.json (the only names ever logged)
    flow: str
    task: str


@dataclass
class Outbox:
    requests: list[Request] = field(default_factory=list)
    refusals: Counter = field(default_factory=Counter)  # reason token -> how many requests


def read(folder: Path, max_requests: int) -> Outbox:
    found = Outbox()
    try:
        directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return found  # no outbox (chaining was off for this run, or the folder is gone): nothing asked
    try:
        names = _request_names(directory)
        if names is None:
            found.refusals["chain-outbox-flooded"] += 1
            return found
        for position, name in enumerate(names):
            if position >= max_requests:
                found.refusals["chain-count-cap"] += len(names) - position
                break
            request = _read_request(directory, name)
            if isinstance(request, str):
                found.refusals[request] += 1
            else:
                found.requests.append(request)
    finally:
        os.close(directory)
    return found


def _request_names(directory: int) -> list[str] | None:
    """The request files' names in numeric order, or None past MAX_ENTRIES entries."""
    numbered = []
    with os.scandir(directory) as entries:
        for count, entry in enumerate(entries, start=1):
            if count > MAX_ENTRIES:
                return None
            match = REQUEST_NAME.fullmatch(entry.name)
            if match:
                numbered.append((int(match.group(1)), entry.name))
    return [name for _, name in sorted(numbered)]


def _read_request(directory: int, name: str) -> Request | str:
    """The request in `name`, or the reason token it is refused with."""
    try:
        # O_NOFOLLOW: a link is refused, never followed; O_NONBLOCK: opening a fifo never waits for a writer.
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except OSError as error:
        not_regular = error.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO)
        return "chain-not-regular-file" if not_regular else "chain-unreadable"
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            return "chain-not-regular-file"
        if status.st_size > MAX_REQUEST_BYTES:
            return "chain-oversize"
        content = os.read(descriptor, MAX_REQUEST_BYTES + 1)
    except OSError:
        return "chain-unreadable"
    finally:
        os.close(descriptor)
    if len(content) > MAX_REQUEST_BYTES:
        return "chain-oversize"  # it grew between the stat and the read
    try:
        document = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "chain-parse-error"
    if not isinstance(document, dict):
        return "chain-parse-error"
    if "command" in document:
        return "chain-command-refused"
    flow = document.get("flow")
    if not isinstance(flow, str) or not FLOW_PATTERN.fullmatch(flow):
        return "chain-bad-flow-name"
    task = document.get("task")
    if not isinstance(task, str) or not task.strip():
        return "chain-bad-task"
    return Request(name=name, flow=flow, task=task)
