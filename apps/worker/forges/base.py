"""What every outbound forge client shares: the answer types, one careful HTTP call, a small cache.

Every answer distinguishes "no" from "could not tell": an authority lookup that fails for any reason
other than a determinate refusal is `Authority.unknown(...)`, never a silent `False`. Reasons are fixed
tokens or `status-<n>`; a response body is never logged or carried (it can echo the token).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Authority:
    """May this actor start paid work here? `allowed` is None when the forge could not tell us."""

    allowed: bool | None
    reason: str = ""

    @classmethod
    def yes(cls, reason: str = "") -> Authority:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> Authority:
        return cls(False, reason)

    @classmethod
    def unknown(cls, reason: str) -> Authority:
        return cls(None, reason)

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
class Response:
    status: int
    data: Any = None  # parsed JSON, or None when the body was not JSON
    headers: dict[str, str] = field(default_factory=dict)


class Unreachable(Exception):
    """No HTTP answer at all (network, timeout, TLS, a redirect we refuse to follow)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect could carry the token to another host: never follow one.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise Unreachable("redirect")


_opener = urllib.request.build_opener(_RefuseRedirects())
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


def get_json(url: str, headers: dict[str, str], timeout: float) -> Response:
    """GET a JSON document. HTTP error statuses are answers (a Response); no answer raises Unreachable."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", **headers}, method="GET")
    try:
        with _opener.open(request, timeout=timeout) as reply:
            status, raw, reply_headers = reply.status, reply.read(MAX_RESPONSE_BYTES), dict(reply.headers)
    except urllib.error.HTTPError as error:
        status, raw, reply_headers = error.code, b"", dict(error.headers or {})
        try:
            raw = error.read(MAX_RESPONSE_BYTES)
        except OSError:
            pass
    except Unreachable:
        raise
    except TimeoutError:
        raise Unreachable("timeout") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None)
        raise Unreachable("timeout" if isinstance(reason, TimeoutError) else "network") from None
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    return Response(status=status, data=data, headers={k.lower(): v for k, v in reply_headers.items()})


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


class ForgeClient:
    """One forge's API as the receiver (and later the worker) needs it.

    Subclasses implement `_lookup_authority` and `_lookup_identity`; this class adds the cache of
    determinate answers and the one place HTTP errors become reason tokens.
    """

    forge = ""
    authority_cache = TTLCache()

    def __init__(self, *, base_url: str, token: str, timeout: float = 3.0, cache_seconds: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.cache_seconds = cache_seconds

    # --- the interface ---

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

    # --- for subclasses ---

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _get(self, url: str) -> Response:
        return get_json(url, self._headers(), self.timeout)

    def _lookup_authority(self, subject: Subject) -> Authority:
        raise NotImplementedError

    def _lookup_identity(self) -> Identity:
        raise NotImplementedError

    @staticmethod
    def identity_failure(response: Response) -> IdentityUnavailable:
        # 401/403: the token is wrong or lacks the scope; retrying will not fix it.
        determinate = response.status in (401, 403, 404)
        return IdentityUnavailable(f"status-{response.status}", determinate=determinate)

    def _repository_permission(self, url_template: str, subject: Subject, allowed: set[str]) -> Authority:
        """GitHub's and Forgejo's shape: `GET .../repos/{owner}/{name}/collaborators/{login}/permission`
        answering `{"permission": "write", ...}`; 404 = not a collaborator."""
        repo = split_repo(subject.repo)
        if repo is None or not safe_path_part(subject.login):
            return Authority.no("unaskable")
        owner, name = repo
        response = self._get(url_template.format(base=self.base_url, owner=owner, name=name, login=subject.login))
        if response.status == 404:
            return Authority.no("not-collaborator")
        if response.status != 200:
            return Authority.unknown(f"status-{response.status}")
        permission = response.data.get("permission") if isinstance(response.data, dict) else None
        if not isinstance(permission, str):
            return Authority.unknown("malformed-answer")
        return Authority.yes(permission) if permission in allowed else Authority.no("read-only")

    def _numeric_user_identity(self, url: str) -> Identity:
        """`GET <url>` answering a user object with a numeric `id` (GitHub, GitLab and Forgejo `/user`)."""
        response = self._get(url)
        if response.status != 200:
            raise self.identity_failure(response)
        user_id = response.data.get("id") if isinstance(response.data, dict) else None
        if not is_int_like(user_id):
            raise IdentityUnavailable("malformed-answer", determinate=False)
        return Identity(id=str(user_id))


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
