"""The agent's history measured from git's object headers, before anything of it is expanded.

A few hundred kilobytes of `.git` can name ten million paths (a tree that lists the same subtree ten times, ten
levels deep) or gigabytes of content (one compressed blob of zeros, listed many times); `read-tree`, `add` or
`diff-tree` over such a commit expands it in memory and on disk. Each unique tree is read once (`cat-file
--batch`) and each unique blob's size comes from its header (`--batch-check`), so what a commit's tree holds
(paths, bytes) is counted in the size of its objects, not of its expansion:

    measured = measure(store, start, commits)
    measured.too_large(bounds)   # None, or the sentence that refuses the work (`work-too-large`)

Bounds: at most PI_PUBLISH_MAX_COMMITS commits; no commit's tree more than PI_MAX_CHANGED_FILES paths or
PI_MAX_PUSH_BYTES bytes beyond the start's (the publish checks' own limits on the final change, so a repository of
any size may be worked on, and no intermediate commit may carry what the final change could not).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from django.conf import settings

TREE_MODE, GITLINK_MODE = b"40000", b"160000"


@dataclass(frozen=True)
class Bounds:
    commits: int
    added_paths: int
    added_bytes: int

    @classmethod
    def from_settings(cls) -> Bounds:
        return cls(commits=settings.PI_PUBLISH_MAX_COMMITS, added_paths=settings.PI_MAX_CHANGED_FILES,
                   added_bytes=settings.PI_MAX_PUSH_BYTES)


@dataclass(frozen=True)
class Measured:
    commits: int
    start_paths: int
    start_bytes: int
    most_paths: int  # the largest commit tree's path count
    most_bytes: int  # and the largest one's bytes

    def too_large(self, bounds: Bounds) -> str | None:
        if self.commits > bounds.commits:
            return f"{self.commits:,} commits (at most {bounds.commits:,}: PI_PUBLISH_MAX_COMMITS)"
        if self.most_paths - self.start_paths > bounds.added_paths:
            return (f"a commit adds {self.most_paths - self.start_paths:,} paths to the start's "
                    f"{self.start_paths:,} (at most {bounds.added_paths:,}: PI_MAX_CHANGED_FILES)")
        if self.most_bytes - self.start_bytes > bounds.added_bytes:
            return (f"a commit's files add up to {self.most_bytes - self.start_bytes:,} bytes beyond the start's "
                    f"(at most {bounds.added_bytes:,}: PI_MAX_PUSH_BYTES)")
        return None


class TooLarge(Exception):
    """Counting stopped early: the work is past a bound already (its sentence)."""


class OutOfTime(Exception):
    """The time the measuring was given ran out."""


class _Objects:
    """One `cat-file --batch` for the trees, read as they are needed, and the blob sizes in one `--batch-check`."""

    def __init__(self, command: list[str], environment: dict, deadline: float):
        self.command, self.environment, self.deadline = command, environment, deadline
        self.process = subprocess.Popen([*command, "cat-file", "--batch"], env=environment, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.totals: dict[bytes, tuple[int, int]] = {}  # tree -> (paths, bytes), each tree counted once

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def _tree(self, oid: bytes) -> list[tuple[bytes, bytes]]:
        """The (mode, oid) entries of a tree object."""
        if time.monotonic() > self.deadline:
            raise OutOfTime()
        self.process.stdin.write(oid + b"\n")
        self.process.stdin.flush()
        header = self.process.stdout.readline().split()
        if len(header) != 3 or header[1] != b"tree":
            raise OSError("not a tree")
        body = self.process.stdout.read(int(header[2]) + 1)[:-1]
        entries, position = [], 0
        while position < len(body):
            space = body.index(b" ", position)
            nul = body.index(b"\0", space)
            entries.append((body[position:space], body[nul + 1:nul + 21].hex().encode()))
            position = nul + 21
        return entries

    def _blob_sizes(self, blobs: set[bytes]) -> dict[bytes, int]:
        if not blobs:
            return {}
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise OutOfTime()
        try:
            result = subprocess.run([*self.command, "cat-file", "--batch-check"], env=self.environment,
                                    input=b"\n".join(blobs) + b"\n", capture_output=True, check=True, timeout=left)
        except subprocess.TimeoutExpired:
            raise OutOfTime() from None
        sizes = {}
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3:
                sizes[parts[0]] = int(parts[2])
        return sizes

    def totals_of(self, root: bytes) -> tuple[int, int]:
        """(paths, bytes) of a root tree, expanded in arithmetic only: each unseen tree is read once, the sizes of
        its blobs asked for at once, then the totals summed children first (iteratively: a deep tree is no
        recursion)."""
        children: dict[bytes, list[tuple[bytes, bytes]]] = {}
        unread = [root]
        while unread:
            oid = unread.pop()
            if oid in children or oid in self.totals:
                continue
            children[oid] = entries = self._tree(oid)
            unread.extend(child for mode, child in entries if mode == TREE_MODE)
        sizes = self._blob_sizes({child for entries in children.values() for mode, child in entries
                                  if mode not in (TREE_MODE, GITLINK_MODE)})
        pending = [(root, False)]
        while pending:
            oid, ready = pending.pop()
            if oid in self.totals:
                continue
            if not ready:  # its subtrees first, then itself
                pending.append((oid, True))
                pending.extend((child, False) for mode, child in children[oid] if mode == TREE_MODE)
                continue
            paths = size = 0
            for mode, child in children[oid]:
                if mode == TREE_MODE:
                    paths, size = paths + self.totals[child][0], size + self.totals[child][1]
                else:
                    paths, size = paths + 1, size + sizes.get(child, 0)
            self.totals[oid] = (paths, size)
        return self.totals[root]


def measure(command: list[str], environment: dict, start_tree: str, trees: list[str], bounds: Bounds,
            seconds: float) -> Measured:
    """`command`: the hardened git on the worker's repository (`git ... --git-dir <store>`); `trees`: the root tree
    of each of the agent's commits above the start (whose own root tree is `start_tree`). Raises TooLarge as soon
    as a bound is passed, OutOfTime after `seconds`, OSError or CalledProcessError when an object cannot be
    read."""
    if len(trees) > bounds.commits:
        raise TooLarge(Measured(len(trees), 0, 0, 0, 0).too_large(bounds))
    objects = _Objects(command, environment, time.monotonic() + seconds)
    try:
        start_paths, start_bytes = objects.totals_of(start_tree.encode())
        measured = Measured(len(trees), start_paths, start_bytes, start_paths, start_bytes)
        for tree in dict.fromkeys(trees):
            paths, size = objects.totals_of(tree.encode())
            measured = Measured(len(trees), start_paths, start_bytes, max(measured.most_paths, paths),
                                max(measured.most_bytes, size))
            if sentence := measured.too_large(bounds):
                raise TooLarge(sentence)
        return measured
    finally:
        objects.close()
