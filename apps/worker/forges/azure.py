"""Azure DevOps: is the actor a member of the project, and who our own token belongs to.

Membership is answered by the Graph API on `vssps`: the actor's subject descriptor, the groups it belongs
to (walked upwards a few levels, so membership through an Entra/AAD group counts), and the project's own
groups (Contributors, Project Administrators, ...; Readers do not count: reading a project is not a
licence to start paid work).
"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, urlencode, urlsplit

from .base import Authority, ForgeClient, Identity, IdentityUnavailable, Subject, TTLCache

API_VERSION = "7.1-preview.1"
GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
MAX_PAGES = 20  # an email actor is looked up by listing users; a larger directory is "could not tell"
MAX_MEMBERSHIP_REQUESTS = 8  # bounds the upward walk through nested groups (a deeper member is refused)
PROJECT_GROUPS_SECONDS = 600
NON_MEMBER_GROUPS = {"readers"}


def graph_url_for(org_url: str) -> str:
    """`https://dev.azure.com/<org>` -> `https://vssps.dev.azure.com/<org>` (and the visualstudio.com form)."""
    parts = urlsplit(org_url.rstrip("/"))
    host = parts.hostname or ""
    if host == "dev.azure.com":
        return f"{parts.scheme}://vssps.dev.azure.com{parts.path}"
    if host.endswith(".visualstudio.com") and ".vssps." not in host:
        org = host.split(".", 1)[0]
        return f"{parts.scheme}://{org}.vssps.visualstudio.com{parts.path}"
    return org_url.rstrip("/")  # Azure DevOps Server serves Graph on the collection URL itself


class _Undetermined(Exception):
    def __init__(self, reason: str):
        self.reason = reason


class AzureClient(ForgeClient):
    forge = "azure"
    project_groups_cache = TTLCache(max_entries=128)

    def __init__(self, *, base_url: str, token: str, graph_url: str = "", **kwargs):
        super().__init__(base_url=base_url, token=token, **kwargs)
        self.graph_url = (graph_url or graph_url_for(base_url)).rstrip("/")

    def _headers(self) -> dict[str, str]:
        credential = base64.b64encode(f":{self.token}".encode()).decode()
        return {"Authorization": f"Basic {credential}", "User-Agent": "pidispatch"}

    def _graph(self, path: str, **params) -> tuple[dict, dict]:
        query = urlencode({**params, "api-version": API_VERSION})
        response = self._get(f"{self.graph_url}/_apis/graph/{path}?{query}")
        if response.status == 404:
            raise LookupError
        if response.status != 200:
            raise _Undetermined(f"status-{response.status}")
        if not isinstance(response.data, dict):
            raise _Undetermined("malformed-answer")
        return response.data, response.headers

    def _descriptor(self, storage_key: str) -> str:
        data, _ = self._graph(f"descriptors/{quote(storage_key, safe='')}")
        value = data.get("value")
        if not isinstance(value, str) or not value:
            raise _Undetermined("malformed-answer")
        return value

    def _pages(self, path: str, **params):
        """The entries of a paged Graph listing; more pages than MAX_PAGES is "could not tell"."""
        token = None
        for _ in range(MAX_PAGES):
            data, headers = self._graph(path, **params, **({"continuationToken": token} if token else {}))
            yield from (entry for entry in data.get("value") or [] if isinstance(entry, dict))
            token = headers.get("x-ms-continuationtoken")
            if not token:
                return
        raise _Undetermined("listing-too-large")

    def _user_descriptor_by_email(self, email: str) -> str | None:
        for user in self._pages("users", subjectTypes="aad,msa"):
            names = {str(user.get(key) or "").casefold() for key in ("principalName", "mailAddress")}
            if email.casefold() in names and isinstance(user.get("descriptor"), str):
                return user["descriptor"]
        return None  # the whole directory was listed: a determinate "not found"

    def _project_groups(self, project_descriptor: str) -> set[str]:
        cached = self.project_groups_cache.get((self.graph_url, project_descriptor))
        if cached is not None:
            return cached
        groups = {
            group["descriptor"] for group in self._pages("groups", scopeDescriptor=project_descriptor)
            if isinstance(group.get("descriptor"), str)
            and str(group.get("displayName") or "").casefold() not in NON_MEMBER_GROUPS
        }
        self.project_groups_cache.put((self.graph_url, project_descriptor), groups, PROJECT_GROUPS_SECONDS)
        return groups

    def _containers(self, descriptor: str) -> list[str]:
        data, _ = self._graph(f"memberships/{quote(descriptor, safe='')}", direction="up")
        return [
            entry["containerDescriptor"] for entry in data.get("value") or []
            if isinstance(entry, dict) and isinstance(entry.get("containerDescriptor"), str)
        ]

    def _lookup_authority(self, subject: Subject) -> Authority:
        if not GUID.fullmatch(subject.project_id or ""):
            return Authority.no("unaskable")
        if not GUID.fullmatch(subject.actor_id or "") and "@" not in (subject.email or ""):
            return Authority.no("unaskable")
        try:
            if GUID.fullmatch(subject.actor_id or ""):
                actor = self._descriptor(subject.actor_id)
            else:
                actor = self._user_descriptor_by_email(subject.email)
                if actor is None:
                    return Authority.no("not-in-directory")
            project_groups = self._project_groups(self._descriptor(subject.project_id))
            return self._walk_up(actor, project_groups)
        except LookupError:
            return Authority.no("not-found")
        except _Undetermined as undetermined:
            return Authority.unknown(undetermined.reason)

    def _walk_up(self, actor: str, project_groups: set[str]) -> Authority:
        seen, frontier, requests = {actor}, [actor], 0
        while frontier:
            descriptor = frontier.pop(0)
            if requests >= MAX_MEMBERSHIP_REQUESTS:
                # Asking again would walk the same groups: a bounded "no", not a retry loop.
                return Authority.no("not-member-within-walk")
            requests += 1
            for container in self._containers(descriptor):
                if container in project_groups:
                    return Authority.yes("project-member")
                if container not in seen:
                    seen.add(container)
                    frontier.append(container)
        return Authority.no("not-member")

    def _lookup_identity(self) -> Identity:
        response = self._get(f"{self.base_url}/_apis/connectionData")
        if response.status != 200:
            raise self.identity_failure(response)
        user = response.data.get("authenticatedUser") if isinstance(response.data, dict) else None
        user_id = user.get("id") if isinstance(user, dict) else None
        if not isinstance(user_id, str) or not GUID.fullmatch(user_id):
            raise IdentityUnavailable("malformed-answer", determinate=False)
        account = ((user.get("properties") or {}).get("Account") or {}).get("$value")
        email = account.strip().lower() if isinstance(account, str) and "@" in account else ""
        return Identity(id=user_id.lower(), email=email)
