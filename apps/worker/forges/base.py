"""What every outbound forge client shares: the answer types, one careful HTTP call, a small cache.

Every answer distinguishes "no" from "could not tell": an authority lookup that fails for any reason
other than a determinate refusal is `Authority.unknown(...)`, never a silent `False`. Reasons are fixed
tokens or `status-<n>`; a response body is never logged. A refusal keeps the forge's own message (`ForgeFailure.
forge_message`, bounded, token-shaped text cut out) for the run record alone, scrubbed again there of the deployment's
tokens: the operator reads why the forge said no on the run page.

Calls go through one `requests` session per forge origin and thread (connections are reused across pages, lookups and
steps), never follow a redirect, and read at most MAX_RESPONSE_BYTES of an answer. A rate limit or an unavailable forge
says how long to wait (`Retry-After`, the reset of the forge's rate-limit headers): `ForgeFailure.retry_after`, bounded
by PI_FORGE_RETRY_AFTER_MAX_SECONDS, which a retried job waits at least.

The worker's calls (a job's token, the default branch, a comment, a pull request's head, finding and
opening a pull request) fail with `ForgeFailure`: `transient` (no answer, 5xx, a rate limit, an answer we
cannot read) is an infrastructure fault to retry; anything else (401/403/404, no credential) is a
configuration refusal with its reason token.
"""

from __future__ import annotations

import base64
import http.cookiejar
import json
import math
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from django.conf import settings

from apps import forge_registry


@dataclass(frozen=True)
class Authority:
    """May this actor start paid work here? `allowed` is None when the forge could not tell us."""

    allowed: bool | None
    reason: str = ""
    # "Could not tell" because the forge asked us to wait (a rate limit, an outage): how long, in seconds.
    retry_after: float | None = field(default=None, compare=False)

    @classmethod
    def yes(cls, reason: str = "") -> Authority:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> Authority:
        return cls(False, reason)

    @classmethod
    def unknown(cls, reason: str, retry_after: float | None = None) -> Authority:
        return cls(None, reason, retry_after)

    @classmethod
    def unanswered(cls, response: Response) -> Authority:
        """A lookup's answer that is neither yes nor no: could not tell, and how long the forge asked us to wait."""
        return cls.unknown(f"status-{response.status}", retry_after(response))

    @property
    def determinate(self) -> bool:
        return self.allowed is not None


@dataclass(frozen=True)
class Subject:
    """Who acted, and where. Only the fields a forge's lookup needs are set; none of them is ever logged."""

    repo: str = ""  # owner/name (GitHub, Forgejo), group/project path (GitLab), project/repo (Azure)
    project_id: str = ""  # GitLab numeric project id; Azure project GUID
    actor_id: str = ""  # numeric id (GitHub, GitLab, Forgejo) or Azure GUID
    login: str = ""  # GitHub / Forgejo login (their permission APIs are keyed by login)
    email: str = ""  # Azure actor known only by email


@dataclass(frozen=True)
class Identity:
    """This deployment's own account on a forge (the bot-loop guard compares actors against it)."""

    id: str
    email: str = ""


class IdentityUnavailable(Exception):
    """The forge could not tell us who we are. `determinate` = asking again will not help (bad token)."""

    def __init__(self, reason: str, determinate: bool):
        super().__init__(reason)
        self.reason = reason
        self.determinate = determinate


@dataclass(frozen=True)
class RepoRef:
    """Which repository a job works on, as each forge's API addresses it. Never logged as a whole."""

    repo: str  # owner/name (GitHub, Forgejo), group/project path (GitLab), project/repo (Azure)
    project_id: str = ""  # GitLab numeric project id; Azure project GUID
    repository_id: str = ""  # Azure repository GUID


@dataclass(frozen=True)
class Credential:
    """The token a job (or a comment) acts with. `source` is "app" (minted per use) or "pat"."""

    token: str = field(repr=False)
    source: str = "pat"
    expires_at: datetime | None = None


@dataclass(frozen=True)
class BranchHead:
    """The default branch as the forge sees it now: its name, its commit, whether it is protected, and the
    URL git clones from (on the forge's own host: the token is sent there)."""

    name: str
    sha: str
    protected: bool
    clone_url: str


@dataclass(frozen=True)
class PullHead:
    """A pull/merge request's head as the forge sees it now."""

    number: int
    sha: str  # the head commit (40/64 hex, lowercased, checked like BranchHead.sha)
    branch: str  # the head branch's name in the head repository
    same_repository: bool  # the head branch lives in the base repository (the worker may push to it); False = a fork
    # A ref OF THE BASE REPOSITORY that holds the head commit, for `git fetch origin <ref>`: GitHub/Forgejo
    # refs/pull/<n>/head, GitLab refs/merge-requests/<iid>/head, Azure refs/heads/<source branch> for a
    # same-repository PR, refs/pull/<id>/merge for a fork.
    fetch_ref: str
    open: bool


@dataclass(frozen=True)
class Fork:
    """The deployment's fork of a repository, where its jobs' work is pushed: a pull request from it is an outside
    contribution, so the origin's CI gives it no secret until a person approves it."""

    repo: str  # owner/name of the fork (GitLab: its path with namespace)
    clone_url: str  # on the forge's own host (the token goes there)
    project_id: str = ""  # GitLab: the fork's numeric project id


@dataclass(frozen=True)
class PullRequest:
    number: int
    url: str  # its web page (for the run record and the admin's link)


class ForgeFailure(Exception):
    """A worker-side forge call that did not succeed. `transient` = retry later; otherwise the reason
    token is a determinate refusal (configuration, permission, a repository that is not there)."""

    def __init__(self, reason: str, *, transient: bool, retry_after: float | None = None, forge_message: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient
        self.retry_after = retry_after  # seconds the forge asked us to wait before asking again (None: it did not say)
        # The forge's own words for a refusal, bounded and cut of token-shaped text: for the run record only (its
        # recorder scrubs it of the deployment's tokens too), never a log line or a forge comment.
        self.forge_message = forge_message


@dataclass(frozen=True)
class Response:
    status: int
    data: Any = None  # parsed JSON, or None when the body was not JSON
    headers: dict[str, str] = field(default_factory=dict)


class Unreachable(Exception):
    """No HTTP answer at all (network, timeout, TLS, a redirect we refuse to follow)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_READ_CHUNK = 64 * 1024
_sessions = threading.local()


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    # A forge's cookies are not ours to send back: each call stands on its own credential, as it did before sessions.
    def set_ok(self, cookie, request):
        return False


def session_for(url: str) -> requests.Session:
    """This thread's session for the forge at `url`'s origin: its connections are kept open and reused."""
    parts = urlsplit(url)
    origin = (parts.scheme, parts.hostname, parts.port)
    known = getattr(_sessions, "by_origin", None)
    if known is None or _sessions.pid != os.getpid():
        # A forked process (RQ's work horse) starts afresh: its parent's open connections stay its parent's.
        known = _sessions.by_origin = {}
        _sessions.pid = os.getpid()
    session = known.get(origin)
    if session is None:
        session = known[origin] = requests.Session()
        session.cookies.set_policy(_NoCookies())
    return session


def _bounded_body(reply: requests.Response) -> bytes:
    """At most MAX_RESPONSE_BYTES of the answer; a longer one is cut, its connection closed rather than drained."""
    body = bytearray()
    for chunk in reply.iter_content(_READ_CHUNK):
        body += chunk
        if len(body) > MAX_RESPONSE_BYTES:
            reply.raw.close()
            break
    return bytes(body[:MAX_RESPONSE_BYTES])


def request_json(method: str, url: str, headers: dict[str, str], timeout: float, body: Any = None) -> Response:
    """One HTTP call with a JSON answer. HTTP error statuses are answers (a Response); no answer raises
    Unreachable. `body`, when given, is sent as JSON."""
    data = json.dumps(body).encode() if body is not None else None
    # Uncompressed: the bound holds for what is read off the wire and what is kept alike (no gzip bomb).
    all_headers = {"Accept": "application/json", "Accept-Encoding": "identity", **headers}
    if data is not None:
        all_headers["Content-Type"] = "application/json"
    try:
        reply = session_for(url).request(method, url, data=data, headers=all_headers, timeout=timeout,
                                         allow_redirects=False, stream=True)
    except requests.Timeout:
        raise Unreachable("timeout") from None
    except (requests.RequestException, OSError, ValueError):
        raise Unreachable("network") from None
    try:
        if reply.is_redirect:
            # A redirect could carry the token to another host: never follow one.
            raise Unreachable("redirect")
        raw = _bounded_body(reply)
    except requests.Timeout:
        raise Unreachable("timeout") from None
    except (requests.RequestException, OSError):
        raise Unreachable("network") from None
    finally:
        reply.close()
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    return Response(status=reply.status_code, data=parsed, headers={k.lower(): v for k, v in reply.headers.items()})


def get_json(url: str, headers: dict[str, str], timeout: float) -> Response:
    """GET a JSON document (see request_json)."""
    return request_json("GET", url, headers, timeout)


def retry_after(response: Response, now: float | None = None) -> float | None:
    """How long the forge asked us to wait, in seconds, bounded by PI_FORGE_RETRY_AFTER_MAX_SECONDS; None when it did
    not say. `Retry-After` (seconds or an HTTP date; every forge), else the reset instant of an exhausted rate limit:
    GitHub's and Azure DevOps' `X-RateLimit-Reset`, GitLab's `RateLimit-Reset` (epoch seconds; a small number is
    read as seconds from now, as the IETF draft writes it)."""
    now = time.time() if now is None else now
    headers = response.headers
    seconds = None
    given = headers.get("retry-after", "").strip()
    if given:
        if given.isdigit():
            seconds = float(given)
        else:
            try:
                seconds = parsedate_to_datetime(given).timestamp() - now
            except (TypeError, ValueError, OverflowError):
                seconds = None
    if seconds is None:
        remaining = headers.get("x-ratelimit-remaining", headers.get("ratelimit-remaining", "")).strip()
        reset = headers.get("x-ratelimit-reset", headers.get("ratelimit-reset", "")).strip()
        if remaining == "0" and reset.isdigit():
            seconds = float(reset) - now if int(reset) > 1_000_000_000 else float(reset)
    if seconds is None:
        return None
    return float(min(max(math.ceil(seconds), 0), settings.PI_FORGE_RETRY_AFTER_MAX_SECONDS))


MAX_FORGE_MESSAGE_CHARS = 500
# Token-shaped text a forge might echo (GitHub's ghp_/gho_/ghs_/github_pat_, GitLab's glpat-, a bearer credential).
_TOKEN_SHAPED = re.compile(r"(?:\b(?:gh[pousr]_|github_pat_|glpat-|glptt-|gldt-)[A-Za-z0-9_\-]{8,}"
                           r"|(?i:bearer|token|basic)\s+[A-Za-z0-9._~+/=\-]{16,})")


def forge_message(data) -> str:
    """The forge's own explanation in a refusal's JSON (`message`, GitHub's `errors[].message`, GitLab's `error`),
    one line, at most MAX_FORGE_MESSAGE_CHARS, token-shaped text cut out; "" when it gave none."""
    if not isinstance(data, dict):
        return ""
    said = []
    for key in ("message", "error", "error_description"):
        value = data.get(key)
        values = value if isinstance(value, list) else [value]
        said += [text for text in values if isinstance(text, str)]
        if isinstance(value, dict):
            said += [f"{name}: {text}" for name, texts in value.items()
                     for text in (texts if isinstance(texts, list) else [texts]) if isinstance(text, str)]
    said += [error.get("message") for error in data.get("errors") or []
             if isinstance(error, dict) and isinstance(error.get("message"), str)]
    text = " ".join(" ".join(said).split())
    return fit(_TOKEN_SHAPED.sub("[scrubbed]", text), MAX_FORGE_MESSAGE_CHARS, "…")


def failure_for(response: Response) -> ForgeFailure:
    """An unexpected answer to a worker-side call, as a reason token and whether to retry (and after how long)."""
    status = response.status
    rate_limited = status == 429 or (
        status == 403 and (response.headers.get("x-ratelimit-remaining") == "0" or "retry-after" in response.headers)
    )
    if rate_limited:
        return ForgeFailure("forge-rate-limited", transient=True, retry_after=retry_after(response))
    if status >= 500:
        return ForgeFailure("forge-unavailable", transient=True, retry_after=retry_after(response))
    said = forge_message(response.data)
    if status in (401, 403):
        return ForgeFailure("forge-auth-refused", transient=False, forge_message=said)
    if status == 404:
        return ForgeFailure("forge-repo-not-found", transient=False, forge_message=said)
    return ForgeFailure("forge-request-refused", transient=False, forge_message=said)


def failure_for_unreachable(error: Unreachable) -> ForgeFailure:
    # A redirect would be refused again on every retry (a renamed repository, a misconfigured URL).
    if error.reason == "redirect":
        return ForgeFailure("forge-redirect-refused", transient=False)
    return ForgeFailure("forge-unreachable", transient=True)


def fit(text: str, limit: int, mark: str) -> str:
    """`text`, or its start with `mark` after it when it is longer than `limit` characters."""
    return text if len(text) <= limit else text[:max(limit - len(mark), 0)] + mark


def basic_authorization(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class TTLCache:
    """A small thread-safe cache of determinate answers (a forge lookup per delivery is the slow part)."""

    def __init__(self, max_entries: int = 512):
        self._entries: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def get(self, key):
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            expires, value = hit
            if expires < time.monotonic():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, key, value, ttl: float) -> None:
        if ttl <= 0:
            return
        with self._lock:
            self._entries[key] = (time.monotonic() + ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# A forge that makes a fork in the background answers before it is there; how long its first GET may take to find it.
FORK_READY_SECONDS = 60


class ForgeClient:
    """One forge's API as the receiver and the worker need it.

    Receiver: `authority` (may this actor start work?) and `self_identity` (who are we?); subclasses
    implement `_lookup_authority` and `_lookup_identity`, this class caches determinate answers.
    Worker: `job_credential` (the token a job acts with), `default_branch` (name, SHA, protection, clone
    URL), `post_comment`, the header `git` sends, and for publishing a run's work: `pull_head`,
    `find_pull_request`, `open_pull_request` and the forge's size limits.
    """

    forge = ""
    authority_cache = TTLCache()
    # The forge's usual names for a token and for the instance URL. No job's container gets them (it holds no
    # forge credential); apps/worker/gates/secrets.py reserves them so that a job's secrets cannot take them.
    token_variables: tuple[str, ...] = ()
    url_variable = ""
    git_user = "x-access-token"  # the user name git sends beside the token (HTTP basic)
    # What the forge accepts, for the publisher (subclasses cite their source). Conservative defaults.
    max_comment_chars = 65_535  # one comment's text
    max_file_bytes = 50 * 1024 * 1024  # one file in a push
    # Applied here to what open_pull_request sends: a longer title or description is cut, never refused.
    max_title_chars = 255
    max_description_chars = 65_535
    draft_prefix = ""  # prepended to a draft's title where the forge marks drafts by their title
    identity_path = "/user"  # under base_url: who the token is (self_identity, and `doctor --live`)
    forks = False  # whether this client publishes through the deployment's fork (`run.publishTo: fork`)

    @classmethod
    def from_settings(cls, **common) -> ForgeClient:
        """The client this deployment's settings configure (`common`: timeout, cache_seconds)."""
        raise NotImplementedError

    def __init__(self, *, base_url: str, token: str, timeout: float = 3.0, cache_seconds: float = 60.0,
                 web_root: str | None = None):
        self.base_url = base_url.rstrip("/")
        # Where its pages are (links to pull requests); forge_client passes the configured one.
        self.web_root = forge_registry.web_root_of_api(self.base_url) if web_root is None else web_root.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.cache_seconds = cache_seconds

    # --- the receiver's interface ---

    def authority(self, subject: Subject) -> Authority:
        """May `subject` start work? Determinate answers are cached for `cache_seconds`."""
        key = (self.forge, self.base_url, subject)
        cached = self.authority_cache.get(key)
        if cached is not None:
            return cached
        try:
            answer = self._lookup_authority(subject)
        except Unreachable as error:
            answer = Authority.unknown(error.reason)
        except ForgeFailure as failure:  # a credential that could not be had (e.g. an App token mint)
            answer = Authority.unknown(failure.reason)
        if answer.determinate:
            self.authority_cache.put(key, answer, self.cache_seconds)
        return answer

    def self_identity(self) -> Identity:
        """This deployment's own account, resolved through the token. Raises IdentityUnavailable."""
        if not self.token:
            raise IdentityUnavailable("no-token", determinate=True)
        try:
            return self._lookup_identity()
        except Unreachable as error:
            raise IdentityUnavailable(error.reason, determinate=False) from None

    # --- the worker's interface ---

    def job_credential(self, ref: RepoRef) -> Credential:
        """The token one job acts with (PAT forges: the configured token). Raises ForgeFailure."""
        if not self.token:
            raise ForgeFailure("forge-unconfigured", transient=False)
        return Credential(token=self.token, source="pat")

    def comment_credential(self, ref: RepoRef) -> Credential:
        """The token the worker's own status comments are posted with."""
        return self.job_credential(ref)

    def release_credential(self, credential: Credential) -> None:
        """Give back a minted token once its job is over (a PAT is kept). Never raises."""

    def default_branch(self, ref: RepoRef, credential: Credential) -> BranchHead:
        """The default branch now: name, SHA, protection, clone URL. Raises ForgeFailure."""
        try:
            return self._default_branch(ref, credential)
        except Unreachable as error:
            raise failure_for_unreachable(error) from None

    def post_comment(self, ref: RepoRef, target_type: str, number: int, text: str) -> None:
        """Post `text` on the issue or pull/merge request. Raises ForgeFailure."""
        credential = self.comment_credential(ref)
        try:
            response = self._post_comment(ref, target_type, number, text, credential)
        except Unreachable as error:
            raise failure_for_unreachable(error) from None
        if response.status not in (200, 201):
            raise failure_for(response)

    def pull_head(self, ref: RepoRef, number: int, credential: Credential) -> PullHead:
        """The pull/merge request's head now: commit, branch, whether it is a fork's, a ref of the base
        repository to fetch it by, open or not. Raises ForgeFailure (`pull-request-missing` when there is
        no such pull request)."""
        if not is_int_like(number) or number < 1:
            raise ForgeFailure("pull-request-missing", transient=False)
        try:
            return self._pull_head(ref, number, credential)
        except Unreachable as error:
            raise failure_for_unreachable(error) from None

    def find_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str,
                          credential: Credential, fork: Fork | None = None) -> PullRequest | None:
        """The OPEN pull/merge request from `head_branch` of this same repository (of `fork`, when given) into
        `base_branch`, or None. Raises ForgeFailure."""
        _check_branches(head_branch, base_branch)
        try:
            if fork is not None:
                return self._find_fork_pull_request(ref, fork, head_branch, base_branch, credential)
            return self._find_pull_request(ref, head_branch, base_branch, credential)
        except Unreachable as error:
            raise failure_for_unreachable(error) from None

    def open_pull_request(self, ref: RepoRef, *, head_branch: str, base_branch: str, title: str, body: str,
                          draft: bool, issue_number: int | None, credential: Credential,
                          fork: Fork | None = None) -> PullRequest:
        """Open a pull/merge request from `head_branch` (of this repository, or of `fork`) into `base_branch`,
        linking `issue_number` the forge's way. One that is already open for the two branches is the answer too,
        so a retried publish never opens a second one. Raises ForgeFailure."""
        _check_branches(head_branch, base_branch)
        if head_branch == base_branch or not isinstance(title, str) or not title.strip() or not isinstance(body, str):
            raise ForgeFailure("forge-request-refused", transient=False)
        if issue_number is not None and (not is_int_like(issue_number) or issue_number < 1):
            raise ForgeFailure("forge-request-refused", transient=False)
        if draft and self.draft_prefix and not title.casefold().startswith(self.draft_prefix.strip().casefold()):
            title = self.draft_prefix + title
        title = fit(title, self.max_title_chars, "…")
        link = self._issue_link(issue_number) if issue_number is not None else ""
        separator = "\n\n" if link and body else ""
        body = fit(body, self.max_description_chars - len(separator) - len(link), "\n\n… (cut to fit)")
        try:
            if fork is not None:
                response = self._open_fork_pull_request(ref, fork, head_branch, base_branch, title,
                                                         body + separator + link, draft is True, issue_number,
                                                         credential)
            else:
                response = self._open_pull_request(ref, head_branch, base_branch, title, body + separator + link,
                                                    draft is True, issue_number, credential)
            if response.status in (200, 201):
                if not isinstance(response.data, dict):
                    raise ForgeFailure("forge-malformed-answer", transient=True)
                return self._opened(ref, response.data)
            if not self._already_exists(response):
                raise failure_for(response)
            existing = (self._find_fork_pull_request(ref, fork, head_branch, base_branch, credential)
                        if fork is not None else self._find_pull_request(ref, head_branch, base_branch, credential))
        except Unreachable as error:
            raise failure_for_unreachable(error) from None
        if existing is None:
            # The forge says one is open, yet none is listed: closed in between (a retry opens a new one).
            raise ForgeFailure("pull-request-conflict", transient=True)
        return existing

    def fork(self, ref: RepoRef, credential: Credential) -> Fork:
        """The deployment's fork of the repository, made when there is none yet, ready to push to. Raises
        ForgeFailure: `fork-unavailable` where this forge (or its credentials) cannot fork here."""
        if not self.forks:
            raise ForgeFailure("fork-unavailable", transient=False)
        try:
            return self._fork(ref, credential)
        except Unreachable as error:
            raise failure_for_unreachable(error) from None

    def fork_credential(self, fork: Fork, credential: Credential) -> Credential:
        """What pushes to the deployment's fork: the job's own credential, unless the forge mints one for the fork
        (a GitHub App's installation on the fork organization); one minted here is released by the caller."""
        return credential

    def git_authorization(self, credential: Credential) -> str:
        """The `Authorization` header git sends (never put into a URL, a config file or an argv)."""
        return basic_authorization(self.git_user, credential.token)

    # --- for subclasses ---

    def _auth_headers(self, token: str) -> dict[str, str]:
        raise NotImplementedError

    def _headers(self, token: str | None = None) -> dict[str, str]:
        return self._auth_headers(self.token if token is None else token)

    def _get(self, url: str, token: str | None = None) -> Response:
        return get_json(url, self._headers(token), self.timeout)

    def _send(self, method: str, url: str, body: Any, token: str | None = None) -> Response:
        return request_json(method, url, self._headers(token), self.timeout, body=body)

    def _answer(self, response: Response, kind: type = dict):
        """The JSON of a 200 answer, or the ForgeFailure it stands for."""
        if response.status != 200:
            raise failure_for(response)
        if not isinstance(response.data, kind):
            raise ForgeFailure("forge-malformed-answer", transient=True)
        return response.data

    def _lookup_authority(self, subject: Subject) -> Authority:
        raise NotImplementedError

    def _lookup_identity(self) -> Identity:
        raise NotImplementedError

    def _default_branch(self, ref: RepoRef, credential: Credential) -> BranchHead:
        raise NotImplementedError

    def _post_comment(self, ref: RepoRef, target_type: str, number: int, text: str,
                      credential: Credential) -> Response:
        raise NotImplementedError

    def _pull_head(self, ref: RepoRef, number: int, credential: Credential) -> PullHead:
        raise NotImplementedError

    def _find_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str,
                           credential: Credential) -> PullRequest | None:
        raise NotImplementedError

    def _open_pull_request(self, ref: RepoRef, head_branch: str, base_branch: str, title: str, body: str,
                           draft: bool, issue_number: int | None, credential: Credential) -> Response:
        raise NotImplementedError

    def _opened(self, ref: RepoRef, data: dict) -> PullRequest:
        """The pull request a successful create answered with."""
        raise NotImplementedError

    def _fork(self, ref: RepoRef, credential: Credential) -> Fork:
        raise NotImplementedError

    def _shared_shape_fork(self, api_root: str, ref: RepoRef, credential: Credential, organization: str = "") -> Fork:
        """GitHub's and Forgejo's shape: POST {api_root}/repos/{owner}/{name}/forks makes the token's account's
        fork (or `organization`'s), or answers the one it has (202, the fork's repository); then the fork's own GET,
        once the forge has made it (GitHub makes it in the background)."""
        owner, name = repo_halves(ref)
        response = self._send("POST", f"{api_root}/repos/{owner}/{name}/forks",
                              {"organization": organization} if organization else {}, credential.token)
        if response.status not in (200, 201, 202):
            raise fork_refused(response)
        data = response.data if isinstance(response.data, dict) else {}
        full_name, parent = data.get("full_name"), part(data, "parent").get("full_name")
        if data.get("fork") is not True or not isinstance(full_name, str) or split_repo(full_name) is None \
                or not isinstance(parent, str) or parent.lower() != ref.repo.lower() \
                or full_name.lower() == ref.repo.lower():
            raise ForgeFailure("fork-unavailable", transient=False)  # what answered is not a fork of this one
        fork = Fork(repo=full_name, clone_url=self.own_clone_url(data.get("clone_url")))
        deadline = time.monotonic() + FORK_READY_SECONDS
        while True:
            ready = self._get(f"{api_root}/repos/{full_name}", credential.token)
            if ready.status == 200:
                return fork
            if ready.status != 404:
                raise failure_for(ready)
            if time.monotonic() > deadline:
                raise ForgeFailure("fork-not-ready", transient=True)
            time.sleep(1)

    @staticmethod
    def _owner_head(fork: Fork, head_branch: str) -> str:
        """GitHub's and Forgejo's name of a fork's branch as a pull request's head: `owner:branch`."""
        return f"{fork.repo.split('/')[0]}:{head_branch}"

    @staticmethod
    def _from_fork(fork: Fork):
        """A `same_repository`-shaped test that a GitHub- or Forgejo-shaped head is the fork's branch."""
        return lambda head, base: str(part(head, "repo").get("full_name") or "").lower() == fork.repo.lower()

    def _open_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str, title: str,
                                body: str, draft: bool, issue_number: int | None, credential: Credential) -> Response:
        """A pull request from the fork's branch into this repository (GitHub's and Forgejo's: the same create,
        its head named `owner:branch`)."""
        return self._open_pull_request(ref, self._fork_head(fork, head_branch), base_branch, title, body, draft,
                                       issue_number, credential)

    def _fork_head(self, fork: Fork, head_branch: str) -> str:
        """How a create names a branch of the fork as its head."""
        raise NotImplementedError

    def _find_fork_pull_request(self, ref: RepoRef, fork: Fork, head_branch: str, base_branch: str,
                                credential: Credential) -> PullRequest | None:
        raise NotImplementedError

    def _already_exists(self, response: Response) -> bool:
        """Does this refusal of a create say an open one exists already for the two branches?"""
        raise NotImplementedError

    def _issue_link(self, issue_number: int) -> str:
        """The text appended to the description that links (and on merge closes) the issue."""
        return f"Closes #{issue_number}"

    def _pull(self, response: Response) -> dict:
        """A pull request object (404: there is none)."""
        if response.status == 404:
            raise ForgeFailure("pull-request-missing", transient=False)
        return self._answer(response)

    def _shared_shape_head(self, pull: dict, number: int, same_repository) -> PullHead:
        """GitHub's and Forgejo's shape: `head` and `base` objects with `ref` and `sha`, `state` open or
        closed, the head at refs/pull/<n>/head. `same_repository(head, base)` tells a fork's apart."""
        head, base = part(pull, "head"), part(pull, "base")
        return self._pull_head_of(pull.get("number"), asked=number, sha=head.get("sha"), branch=head.get("ref"),
                                  same_repository=same_repository(head, base), fetch_ref=f"refs/pull/{number}/head",
                                  open=pull.get("state") == "open")

    @staticmethod
    def _shared_shape_open(pulls: list, head_branch: str, base_branch: str, same_repository) -> list[dict]:
        """Of GitHub- or Forgejo-shaped pull requests, the open ones from `head_branch` of this repository
        into `base_branch`."""
        return [pull for pull in pulls if isinstance(pull, dict) and pull.get("state") == "open"
                and part(pull, "head").get("ref") == head_branch and part(pull, "base").get("ref") == base_branch
                and same_repository(part(pull, "head"), part(pull, "base")) and is_int_like(pull.get("number"))]

    def _oldest(self, ref: RepoRef, found: list[dict], number_key: str) -> PullRequest | None:
        """The lowest-numbered of the matching pull requests (a forge keeps one open; a race can make two)."""
        if not found:
            return None
        return self._pull_request_of(ref, min(found, key=lambda pull: pull[number_key])[number_key])

    @staticmethod
    def _pull_head_of(number, *, asked: int, sha, branch, same_repository: bool, fetch_ref: str,
                      open: bool) -> PullHead:
        """Check what the forge said about a pull request's head before anything fetches or pushes it."""
        if number != asked or not isinstance(sha, str) or not SHA.fullmatch(sha) or not safe_branch(branch):
            raise ForgeFailure("forge-malformed-answer", transient=True)
        return PullHead(number=asked, sha=sha.lower(), branch=branch, same_repository=same_repository is True,
                        fetch_ref=fetch_ref, open=open is True)

    def _pull_request_of(self, ref: RepoRef, number) -> PullRequest:
        """The pull request `number` and its page, built from the web root this deployment knows the forge by
        (never the address an answer names: a stand-in or a proxy answers with another host's)."""
        if not is_int_like(number) or number < 1:
            raise ForgeFailure("forge-malformed-answer", transient=True)
        return PullRequest(number=number, url=forge_registry.pull_url(self.forge, ref.repo, number,
                                                                      root=self.web_root))

    def _branch(self, url: str, credential: Credential) -> tuple[dict, dict]:
        """A branch object and its `commit` (GitHub, GitLab and Forgejo answer alike); 404 = the default
        branch has no commit yet (an empty repository)."""
        response = self._get(url, credential.token)
        if response.status == 404:
            raise ForgeFailure("default-branch-missing", transient=False)
        branch = self._answer(response)
        return branch, branch.get("commit") if isinstance(branch.get("commit"), dict) else {}

    def _branch_head(self, name, sha, protected, clone_url) -> BranchHead:
        """Check what the forge said about its default branch before anything acts on it."""
        if not isinstance(name, str) or not name:
            raise ForgeFailure("default-branch-missing", transient=False)
        if not isinstance(sha, str) or not SHA.fullmatch(sha):
            raise ForgeFailure("forge-malformed-answer", transient=True)
        return BranchHead(name=name, sha=sha.lower(), protected=protected is True,
                          clone_url=self.own_clone_url(clone_url))

    def own_clone_url(self, url) -> str:
        """The clone URL without any user info, provided it is on this forge's own host (the job's token
        goes there): the API's host, or the API host without its `api.` prefix (api.github.com)."""
        base = urlsplit(self.base_url)
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or not parts.hostname:
            raise ForgeFailure("forge-malformed-answer", transient=True)
        base_hosts = {_host_port(base.hostname or "", base.port)}
        if (base.hostname or "").startswith("api."):
            base_hosts.add(_host_port(base.hostname[len("api."):], base.port))
        if parts.scheme not in {"https", base.scheme} or _host_port(parts.hostname, parts.port) not in base_hosts:
            raise ForgeFailure("forge-clone-url-refused", transient=False)
        return urlunsplit((parts.scheme, _host_port(parts.hostname, parts.port), parts.path, "", ""))

    @staticmethod
    def identity_failure(response: Response) -> IdentityUnavailable:
        # 401/403: the token is wrong or lacks the scope; retrying will not fix it.
        determinate = response.status in (401, 403, 404)
        return IdentityUnavailable(f"status-{response.status}", determinate=determinate)

    def _repository_permission(self, url_template: str, subject: Subject, allowed: set[str],
                               token: str | None = None) -> Authority:
        """GitHub's and Forgejo's shape: `GET .../repos/{owner}/{name}/collaborators/{login}/permission`
        answering `{"permission": "write", ...}`; 404 = not a collaborator."""
        repo = split_repo(subject.repo)
        if repo is None or not safe_path_part(subject.login):
            return Authority.no("unaskable")
        owner, name = repo
        response = self._get(url_template.format(base=self.base_url, owner=owner, name=name, login=subject.login),
                             token)
        if response.status == 404:
            return Authority.no("not-collaborator")
        if response.status != 200:
            return Authority.unanswered(response)
        permission = response.data.get("permission") if isinstance(response.data, dict) else None
        if not isinstance(permission, str):
            return Authority.unknown("malformed-answer")
        return Authority.yes(permission) if permission in allowed else Authority.no("read-only")

    def _numeric_user_identity(self, url: str, token: str | None = None) -> Identity:
        """`GET <url>` answering a user object with a numeric `id` (GitHub, GitLab and Forgejo `/user`)."""
        response = self._get(url, token)
        if response.status != 200:
            raise self.identity_failure(response)
        user_id = response.data.get("id") if isinstance(response.data, dict) else None
        if not is_int_like(user_id):
            raise IdentityUnavailable("malformed-answer", determinate=False)
        return Identity(id=str(user_id))


SHA = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")
# What `git check-ref-format --branch` refuses, and a leading `-` (an option to git).
_BAD_BRANCH = re.compile(r"(?:^[-/.]|\.\.|@\{|//|[\x00-\x20\x7f~^:?*\[\\]|[/.]$|\.lock$|/\.|\.lock/|^@$)")


def safe_branch(name) -> bool:
    """A branch name git accepts, that no command line can take for an option."""
    return isinstance(name, str) and 0 < len(name) <= 255 and not _BAD_BRANCH.search(name)


def _check_branches(*names) -> None:
    if not all(safe_branch(name) for name in names):
        raise ForgeFailure("forge-request-refused", transient=False)


def _host_port(host: str, port: int | None) -> str:
    return f"{host.lower()}:{port}" if port else host.lower()


def fork_refused(response: Response) -> ForgeFailure:
    """What a refused fork request stands for: a transient fault is tried again; a determinate refusal (403, 404,
    422: forking disabled, a token that may not) is `fork-unavailable`, and the job is not run."""
    failure = failure_for(response)
    if failure.transient:
        return failure
    return ForgeFailure("fork-unavailable", transient=False, forge_message=failure.forge_message)


def repo_halves(ref: RepoRef) -> tuple[str, str]:
    """owner, name of an `owner/name` repository, or the determinate refusal of one that is not."""
    halves = split_repo(ref.repo)
    if halves is None:
        raise ForgeFailure("forge-repo-not-found", transient=False)
    return halves


def part(data: dict, key: str) -> dict:
    """The object under `key` ({} when it is absent or not an object)."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def is_int_like(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def safe_path_part(value: str) -> bool:
    """A login or repo half that can be put into a URL path as is (no traversal, no query, no spaces)."""
    return (
        isinstance(value, str)
        and bool(value)
        and value not in (".", "..")
        and not any(ch in value for ch in "/?#%\\") and not any(ch.isspace() for ch in value)
    )


def split_repo(repo: str) -> tuple[str, str] | None:
    parts = repo.split("/") if isinstance(repo, str) else []
    if len(parts) != 2 or not all(safe_path_part(part) for part in parts):
        return None
    return parts[0], parts[1]
