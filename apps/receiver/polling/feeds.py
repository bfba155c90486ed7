"""One repository's three feeds, read once: each new item becomes the webhook payload it corresponds to and goes
through the intake (apps/receiver/intake.py) as a delivery of its own, and the repository's cursor moves past it.

The payloads carry what the GitHub hook's normaliser reads (apps/receiver/hooks/github.py): the action, the
issue or pull request object as the REST API serves it (the same shape the webhook embeds), `repository`,
`sender` (the event's actor, the comment's author, the pull request's author), and the label or comment.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from email.utils import parsedate_to_datetime

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.receiver import intake
from apps.receiver.models import PollCursor

from .reader import Reader, RepoFailed, repo_path

logger = logging.getLogger("pidispatch.poller")

PAGE = 100
EVENT_PAGES = 5  # newest first: deeper than this since the last poll is skipped (logged)
PULL_PAGES = 10
# The issue events a webhook would start work on. A pull request's reopen comes from the pulls feed instead (its
# delivery id is its head's, so a reopen at the same commit is the delivery its opening was, as the ancestor's).
EVENT_ACTIONS = {"labeled", "closed"}
ISSUE_ONLY_ACTIONS = {"reopened"}


def _id(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _when(value) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


class RepoPoll:
    def __init__(self, reader: Reader, cursor: PollCursor):
        self.reader, self.cursor, self.repo = reader, cursor, cursor.repo
        self.base = repo_path(cursor.repo)

    # --- the cycle ----------------------------------------------------------------------------------------

    def run(self) -> None:
        if self.cursor.armed_at is None:
            self.arm()
            return
        self.events()
        self.comments()
        self.pulls()
        self.cursor.polled_at = timezone.now()
        self.cursor.save(update_fields=["polled_at"])

    def arm(self) -> None:
        """The first look: remember where each feed is, start nothing (what is already there is not news)."""
        events = self.reader.get(self.repo, f"{self.base}/issues/events", {"per_page": PAGE})
        now = _server_time(events.headers.get("date", ""))  # GitHub's clock: comments are compared with it
        pulls = self._open_pulls(etag="")
        self.cursor.events_id = max((_id(event.get("id")) for event in _items(events.data)), default=0)
        self.cursor.comments_since = now
        self.cursor.comments_id = 0
        comments = self.reader.get(self.repo, f"{self.base}/issues/comments", self._comment_params(now))
        self.cursor.comments_id = max((_id(comment.get("id")) for comment in _items(comments.data)), default=0)
        self.cursor.pulls = {str(number): sha for number, sha, _ in pulls[0]}
        self.cursor.etags = {"events": events.headers.get("etag", ""), "pulls": pulls[1],
                             "comments": comments.headers.get("etag", "")}
        self.cursor.armed_at = self.cursor.polled_at = now
        self.cursor.save()
        logger.info("poll_armed repo=%s events_id=%d open_pulls=%d", self.repo, self.cursor.events_id,
                    len(self.cursor.pulls))

    def _save_etag(self, feed: str, etag: str) -> None:
        if etag and self.cursor.etags.get(feed) != etag:
            self.cursor.etags = {**self.cursor.etags, feed: etag}
            self.cursor.save(update_fields=["etags"])

    # --- issue events: labeled, closed ---------------------------------------------------------------------

    def events(self) -> None:
        first = self.reader.get(self.repo, f"{self.base}/issues/events", {"per_page": PAGE},
                                etag=self.cursor.etags.get("events", ""))
        if first.status == 304:
            return
        fetched = _items(first.data)
        page = 1
        while len(fetched) >= PAGE * page and min(_id(e.get("id")) for e in fetched) > self.cursor.events_id:
            if page == EVENT_PAGES:
                logger.warning("poll_events_gap repo=%s pages=%d", self.repo, EVENT_PAGES)
                break
            page += 1
            fetched += _items(self.reader.get(self.repo, f"{self.base}/issues/events",
                                              {"per_page": PAGE, "page": page}).data)
        fresh = sorted((e for e in fetched if _id(e.get("id")) > self.cursor.events_id), key=lambda e: _id(e["id"]))
        for event in fresh:
            issue = event.get("issue")
            if isinstance(issue, dict) and (event.get("event") in EVENT_ACTIONS or (
                    event.get("event") in ISSUE_ONLY_ACTIONS and "pull_request" not in issue)):
                self._event(event)
            self.cursor.events_id = _id(event["id"])
            self.cursor.save(update_fields=["events_id"])
        self._save_etag("events", first.headers.get("etag", ""))

    def _event(self, event: dict) -> None:
        issue, action = event["issue"], event["event"]
        extra = {"label": event["label"]} if isinstance(event.get("label"), dict) else {}
        if "pull_request" in issue:
            number = _id(issue.get("number"))
            pull = self._item(f"{self.base}/pulls/{number}")
            if pull is None:
                return
            self.deliver("pull_request", f"poll-e{event['id']}", {"action": action, "number": number,
                                                                   "pull_request": pull, **extra},
                         sender=event.get("actor"))
        else:
            self.deliver("issues", f"poll-e{event['id']}", {"action": action, "issue": issue, **extra},
                         sender=event.get("actor"))

    # --- issue comments: new ones (edits are not news, as the webhook path ignores `edited`) ----------------

    def comments(self) -> None:
        since = self.cursor.comments_since or self.cursor.armed_at
        answer = self.reader.get(self.repo, f"{self.base}/issues/comments", self._comment_params(since),
                                 etag=self.cursor.etags.get("comments", ""))
        if answer.status == 304:
            return
        listed = _items(answer.data)
        new = sorted((comment for comment in listed if _id(comment.get("id")) > self.cursor.comments_id
                      and (_when(comment.get("created_at")) or since) >= self.cursor.armed_at),
                     key=lambda comment: comment["id"])
        for comment in new:
            number = _issue_number(comment.get("issue_url"))
            issue = self._item(f"{self.base}/issues/{number}") if number else None
            if issue is not None:
                self.deliver("issue_comment", f"poll-c{comment['id']}",
                             {"action": "created", "issue": issue, "comment": comment}, sender=comment.get("user"))
            self.cursor.comments_id = _id(comment["id"])
            self.cursor.save(update_fields=["comments_id"])
        latest = max((_when(comment.get("updated_at")) for comment in listed if _when(comment.get("updated_at"))),
                     default=None)
        if latest is not None and latest > since:
            self.cursor.comments_since = latest  # inclusive: the boundary's comments come again, their ids say seen
            self.cursor.save(update_fields=["comments_since"])
        self._save_etag("comments", answer.headers.get("etag", ""))

    @staticmethod
    def _comment_params(since: datetime) -> dict:
        return {"sort": "updated", "direction": "asc", "per_page": PAGE, "since": since.strftime("%Y-%m-%dT%H:%M:%SZ")}

    # --- pull requests: opened, pushed to (synchronize), reopened -----------------------------------------

    def _open_pulls(self, etag: str) -> tuple[list[tuple[int, str, dict]] | None, str]:
        found: list[tuple[int, str, dict]] = []
        first_etag = ""
        for page in range(1, PULL_PAGES + 1):
            answer = self.reader.get(self.repo, f"{self.base}/pulls",
                                     {"state": "open", "sort": "updated", "direction": "asc", "per_page": PAGE,
                                      "page": page}, etag=etag if page == 1 else "")
            if answer.status == 304:
                return None, etag
            if page == 1:
                first_etag = answer.headers.get("etag", "")
            pulls = _items(answer.data)
            for pull in pulls:
                number, sha = _id(pull.get("number")), (pull.get("head") or {}).get("sha")
                if number and isinstance(sha, str) and sha:
                    found.append((number, sha, pull))
            if len(pulls) < PAGE:
                break
        return found, first_etag

    def pulls(self) -> None:
        found, etag = self._open_pulls(etag=self.cursor.etags.get("pulls", ""))
        if found is None:
            return
        known = dict(self.cursor.pulls)
        for number, sha, pull in found:
            before = known.get(str(number))
            action = ("opened" if before is None else "reopened" if before == "closed"
                      else "synchronize" if before != sha else "")
            if action:
                self.deliver("pull_request", f"poll-pr{number}-{sha[:7]}",
                             {"action": action, "number": number, "pull_request": pull}, sender=pull.get("user"))
                known[str(number)] = sha
                self.cursor.pulls = dict(known)
                self.cursor.save(update_fields=["pulls"])
        still_open = {str(number) for number, _, _ in found}
        closed = {number: "closed" for number, state in known.items() if number not in still_open and state != "closed"}
        if closed:
            self.cursor.pulls = {**known, **closed}
            self.cursor.save(update_fields=["pulls"])
        self._save_etag("pulls", etag)

    def _item(self, path: str) -> dict | None:
        """One issue or pull request an item names; None when it is gone (a deleted issue): the item is skipped,
        and the feed does not stall on it."""
        try:
            data = self.reader.get(self.repo, path).data
        except RepoFailed as failure:
            if failure.reason != "not-found":
                raise
            logger.info("poll_item_gone repo=%s path=%s", self.repo, path)
            return None
        return data if isinstance(data, dict) else None

    # --- into the intake ----------------------------------------------------------------------------------------

    def deliver(self, event: str, delivery_id: str, payload: dict, *, sender) -> None:
        owner, _, name = self.repo.partition("/")
        payload = {**payload, "repository": {"full_name": self.repo, "name": name, "owner": {"login": owner}},
                   "sender": sender if isinstance(sender, dict) else {}}
        raw = json.dumps(payload).encode()
        answer = intake.receive("github", event, delivery_id, raw, payload)
        counts = self.reader.counts
        counts.deliveries += 1
        counts.queued += answer.outcome == "queued"
        counts.duplicates += answer.outcome == "duplicate"
        logger.info("poll_delivered repo=%s delivery=%s event=%s outcome=%s jobs=%s", self.repo, delivery_id, event,
                    answer.outcome, ",".join(answer.body.get("jobs", [])) or "-")


def _items(data) -> list[dict]:
    return [item for item in data if isinstance(item, dict) and _id(item.get("id") or item.get("number"))] \
        if isinstance(data, list) else []


def _server_time(date: str) -> datetime:
    try:
        return parsedate_to_datetime(date).replace(microsecond=0)
    except (TypeError, ValueError):
        return timezone.now().replace(microsecond=0)


def _issue_number(url) -> int:
    tail = url.rstrip("/").rsplit("/", 1)[-1] if isinstance(url, str) else ""
    return int(tail) if tail.isdigit() else 0


def poll_repo(reader: Reader, repo: str) -> None:
    """One repository, once; RepoFailed / RateLimited for the caller to log and go on (or wait)."""
    cursor, _ = PollCursor.objects.get_or_create(repo=repo)
    RepoPoll(reader, cursor).run()


__all__ = ["RepoFailed", "poll_repo"]
