"""A stand-in for the forges: a small local HTTP server answering their API calls (JSON per path) and serving
bare git repositories over HTTP through `git http-backend`, plus helpers to make those repositories.

The forges' SaaS cannot be reached from these machines, so the tests (tests/receiver_support.py) and the
`make run` demo use this instead. Response shapes follow each forge's documented answers.

Pull/merge requests are stateful: the repository helpers also serve each forge's get-one, list (with its own
filters) and create calls over one store, `pull_requests` (forge-neutral records, see `add_pull_request`),
refusing a second open one for the same branches the way the forge does.

`github_issue_feeds(repo)` serves what the GitHub poller reads (issue events, issue comments, issues, the open pull
requests list) with ETags, 304s and a rate budget.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

AZURE_PROJECT_ID = "068d2409-14eb-4d8a-88bf-c8a9e7f5b4e2"
AZURE_FORK_PROJECT = "pidispatch-forks"  # where its Azure DevOps makes the deployment's forks (AZURE_FORK_PROJECT)
# A project's groups as Azure DevOps creates them: the well-known ones by the sub-authorities that end their
# SID, the process template's with a random SID of their own (`-1-` and four random numbers).
AZURE_PROJECT_GROUPS = {
    "Project Administrators": "0-0-0-0-1",
    "Project Valid Users": "0-0-0-0-3",
    "Contributors": "1-761421892-2748544845-2977242239-3150325524",
    "Build Administrators": "1-2394225636-2902941545-2752542587-4098799456",
    "Readers": "1-3179025561-1155312432-2381640919-2227411202",
    "Stakeholders (read-only)": "1-1402381766-3063297741-2203470427-1306458315",
}


def azure_project_group_descriptors(project_id: str) -> dict[str, str]:
    """`vssgp.<base64 of the SID>` of each of the project's groups (the project's domain comes from its id)."""
    domain = "-".join(str(int(project_id.replace("-", "")[i:i + 8], 16)) for i in range(0, 32, 8))
    return {name: "vssgp." + base64.b64encode(f"S-1-9-1551374245-{domain}-{tail}".encode()).decode().rstrip("=")
            for name, tail in AZURE_PROJECT_GROUPS.items()}


# --- a stand-in for the forges' APIs ---------------------------------------------------------------------------

class FakeForge:
    """A local HTTP server answering JSON per path. `routes[path] = (status, body[, headers])` answers GET;
    `routes[("POST", path)]` (or DELETE, ...) answers other methods; a route may be a callable taking the
    parsed request. Every request is recorded (method, path, query, headers, and the JSON body).

    `serve_git(root, authorization)` also makes it a git remote: `/git/<name>.git` is the bare repository
    `root/<name>.git`, served by `git http-backend` to requests carrying exactly that Authorization header (or
    one of several: each forge's client sends its own user name beside the token).

    `serve_pages()` adds the forge's web pages for people: each issue and pull/merge request as readable HTML."""

    def __init__(self, address: str = "127.0.0.1"):
        self.routes: dict = {}
        self.patterns: list = []  # (method, compiled path regex, route), tried after `routes`
        self.fallback = None  # answers paths without a route (default: 404)
        self.requests: list[dict] = []
        self.git_root: Path | None = None
        self.git_authorizations: frozenset[str] = frozenset()
        # Issues the forge knows beyond the poller's feeds, for their pages: (forge, repo, number) -> record.
        self.issues: dict[tuple[str, str, int], dict] = {}
        # Every pull/merge request the forge knows: opened through its API (`created`) or added by a test.
        self.pull_requests: list[dict] = []
        self._pull_repositories: dict[tuple[str, str], dict] = {}
        self.any_git_name: str | None = None  # the bare repository every unregistered repository is served from
        # Pull/merge requests made when first asked for (`make run`'s stand-in: a sample delivery names one).
        self.pulls_on_demand = False
        # GET paths answered as GitHub answers its REST API: an ETag on every 200, and 304 (no body) to a request
        # whose If-None-Match is the current one. A 200 costs one request of the hour's rate budget, a 304 none
        # (docs.github.com, "Use conditional requests if appropriate"); both say what is left.
        self.conditional: list[re.Pattern] = []
        self.rate_limit = 5000
        self.rate_remaining = 5000
        self.not_modified = 0  # 304s answered
        self.issue_feeds: dict[str, GitHubIssueFeeds] = {}
        self._pull_lock = threading.Lock()
        self.forks: dict[str, str] = {}  # a fork's name (its git repository's) -> the repository it forks
        self.fork_routes: list = []  # the routes each fork added (forgotten with it)
        forge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _request(self, method):
                parts = urlsplit(self.path)
                request = {"method": method, "path": parts.path, "query": parse_qs(parts.query),
                           "headers": {k.lower(): v for k, v in self.headers.items()}}
                return parts, request

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self, method):
                parts, request = self._request(method)
                raw = self._read_body() if method in ("POST", "PUT", "PATCH") else b""
                if forge.git_root is not None and parts.path.startswith("/git/"):
                    forge.requests.append(request)
                    return self._git(parts, raw)
                try:
                    request["body"] = json.loads(raw) if raw else None
                except ValueError:
                    request["body"] = raw
                forge.requests.append(request)
                key = parts.path if method == "GET" else (method, parts.path)
                route = forge.routes.get(key) or next(
                    (answer for verb, pattern, answer in forge.patterns
                     if verb == method and pattern.fullmatch(parts.path)), forge.fallback)
                if callable(route):
                    route = route(request)
                if route is None:
                    route = (404, {"message": "404 Not Found"})
                status, body, *extra = route
                if isinstance(body, float):  # a delay in seconds: answer too late
                    time.sleep(body)
                    status, body = 200, {}
                payload = b"" if body is None else json.dumps(body).encode() if not isinstance(body, bytes) else body
                headers = dict(extra[0]) if extra else {}
                if method == "GET" and any(pattern.fullmatch(parts.path) for pattern in forge.conditional):
                    status, payload = forge._conditional(request, status, payload, headers)
                self.send_response(status)
                if status != 304 and "Content-Type" not in headers:
                    self.send_header("Content-Type", "application/json")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _git(self, parts, raw: bytes):
                if self.headers.get("Authorization") not in forge.git_authorizations:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                env = {
                    "PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(forge.git_root), "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": parts.path[len("/git"):], "QUERY_STRING": parts.query,
                    "REQUEST_METHOD": self.command, "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(raw)), "REMOTE_ADDR": "127.0.0.1", "REMOTE_USER": "tester",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                    "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(forge.git_root),
                }
                result = subprocess.run(["git", "http-backend"], input=raw, env=env, capture_output=True, timeout=60)
                head, _, body = result.stdout.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

            def do_DELETE(self):
                self._answer("DELETE")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False  # a deliberately slow answer must not hold up the test's teardown
        self.url = f"http://{address}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def paths(self) -> list[str]:
        return [request["path"] for request in self.requests]

    def posted(self, path: str | None = None) -> list[dict]:
        """The JSON bodies POSTed to the API (to `path`, when given), oldest first; git's own requests aside."""
        return [request["body"] for request in self.requests
                if request["method"] == "POST" and "body" in request and (path is None or request["path"] == path)]

    def route(self, method: str, pattern: str, answer) -> None:
        """Answer `method` on every path matching the regex `pattern`."""
        self.patterns.append((method, re.compile(pattern), answer))

    def _conditional(self, request: dict, status: int, payload: bytes, headers: dict) -> tuple[int, bytes]:
        headers.update({"X-RateLimit-Limit": str(self.rate_limit), "X-RateLimit-Reset": str(int(time.time()) + 3600),
                        "X-RateLimit-Resource": "core"})
        etag = f'W/"{hashlib.sha256(payload).hexdigest()[:32]}"'
        if status == 200:
            headers["ETag"] = etag
        if status == 200 and request["headers"].get("if-none-match") == etag:
            self.not_modified += 1
            status, payload = 304, b""
        elif self.rate_remaining == 0:
            status, payload = 403, json.dumps({"message": "API rate limit exceeded for user ID 1.",
                                               "documentation_url": "https://docs.github.com/rest/rate-limit"}).encode()
            headers.pop("ETag", None)
        else:
            self.rate_remaining -= 1
        headers["X-RateLimit-Remaining"] = str(self.rate_remaining)
        return status, payload

    def github_issue_feeds(self, repo: str) -> GitHubIssueFeeds:
        """`repo`'s issues, their events and comments, and its pull requests list, as the GitHub poller reads them
        (conditional, rate-counted): add issues, labels, closes, comments and pull requests through the result."""
        if repo not in self.issue_feeds:
            self.issue_feeds[repo] = GitHubIssueFeeds(self, repo)
        return self.issue_feeds[repo]

    def serve_git(self, root: Path, authorization: str | tuple[str, ...]) -> None:
        self.git_root = Path(root)
        self.git_authorizations = frozenset([authorization] if isinstance(authorization, str) else authorization)

    @property
    def git_authorization(self) -> str | None:
        return next(iter(self.git_authorizations), None)

    @git_authorization.setter
    def git_authorization(self, authorization: str) -> None:
        """Only this one from now on (a test revoking the others)."""
        self.git_authorizations = frozenset([authorization])

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # --- typical answers ---

    def github_permission(self, repo: str, login: str, permission: str | None, status: int = 200):
        self.routes[f"/repos/{repo}/collaborators/{login}/permission"] = (
            status, {"permission": permission, "role_name": permission, "user": {"login": login}})

    def gitlab_member(self, project: str, user_id: str | int, access_level: int | None, status: int = 200):
        self.routes[f"/api/v4/projects/{project}/members/all/{user_id}"] = (
            status, {"id": int(user_id), "username": "someone", "access_level": access_level, "state": "active"})

    def forgejo_permission(self, repo: str, login: str, permission: str | None, status: int = 200):
        self.routes[f"/api/v1/repos/{repo}/collaborators/{login}/permission"] = (
            status, {"permission": permission, "role_name": permission, "user": {"login": login}})

    def azure_member(self, actor_guid: str, project_id: str = AZURE_PROJECT_ID, member: bool = True,
                     group: str | None = None, names: dict | None = None) -> dict[str, str]:
        """The Graph answers for: actor descriptor, project descriptor, the project's groups, actor memberships.

        The project has the groups a new project gets (AZURE_PROJECT_GROUPS) plus a custom read-only one,
        with descriptors as Azure DevOps makes them (`vssgp.` + base64 of the SID; well-known groups end in
        `-0-0-0-0-<n>`, the process template's have a random SID). The actor is in `group` (Contributors, or
        Readers when not `member`); `names` renames groups, as a localised server names them. Returns each
        group's descriptor by its English name."""
        actor_descriptor = f"aad.{actor_guid[:8]}"
        project_descriptor = f"scp.{project_id[:8]}"
        descriptors = azure_project_group_descriptors(project_id)
        names = names or {}
        self.routes[f"/_apis/graph/descriptors/{actor_guid}"] = (200, {"value": actor_descriptor})
        self.routes[f"/_apis/graph/descriptors/{project_id}"] = (200, {"value": project_descriptor})
        self.routes["/_apis/graph/groups"] = (200, {"count": len(descriptors), "value": [
            {"subjectKind": "group", "descriptor": descriptor, "displayName": names.get(name, name),
             "principalName": f"[Fabrikam]\\{names.get(name, name)}", "origin": "vsts",
             "domain": f"vstfs:///Classification/TeamProject/{project_id}"}
            for name, descriptor in descriptors.items()]})
        container = descriptors[group or ("Contributors" if member else "Readers")]
        self.routes[f"/_apis/graph/memberships/{actor_descriptor}"] = (200, {"count": 1, "value": [
            {"containerDescriptor": container, "memberDescriptor": actor_descriptor},
        ]})
        return descriptors

    # --- a forge job's side: repositories, branches, comments, tokens ---

    def github_repository(self, repo: str, sha: str, *, branch: str = "main", protected: bool = True,
                          rules: tuple = (), clone_url: str | None = None):
        self.routes[f"/repos/{repo}"] = (200, {
            "id": 1296269, "full_name": repo, "private": True, "default_branch": branch,
            "clone_url": clone_url or f"{self.url}/git/{repo}.git", "html_url": f"https://github.com/{repo}"})
        self.routes[f"/repos/{repo}/branches/{branch}"] = (200, {
            "name": branch, "commit": {"sha": sha, "url": f"{self.url}/repos/{repo}/commits/{sha}"},
            "protected": protected, "protection_url": f"{self.url}/repos/{repo}/branches/{branch}/protection"})
        self.routes[f"/repos/{repo}/rules/branches/{branch}"] = (200, [
            {"type": rule, "ruleset_source_type": "Repository", "ruleset_source": repo, "ruleset_id": 42}
            for rule in rules])
        self.route("POST", rf"/repos/{re.escape(repo)}/issues/\d+/comments",
                   (201, {"id": 1, "body": "", "user": {"login": "pi-bot[bot]"}}))
        self._pull_repository("github", repo, git_name=repo)
        self._github_pull_routes(re.escape(repo))
        self.add_forks("github", repo)  # jobs publish through the deployment's fork by default

    def add_forks(self, forge: str, repo: str, owner: str = "pidispatch-bot") -> None:
        """The fork API of GitHub (docs.github.com/rest/repos/forks) or Forgejo (POST /api/v1/repos/.../forks) for
        `repo`: a POST makes `owner`'s fork, a bare copy of the served repository, and answers 202 with it (a second
        POST answers the same fork); a pull request whose head is `owner:<branch>` comes from it."""
        api = {"github": "", "forgejo": "/api/v1"}[forge]
        self.routes[("POST", f"{api}/repos/{repo}/forks")] = \
            lambda request: self._fork(forge, repo, (request["body"] or {}).get("organization") or owner)

    def _fork(self, forge: str, repo: str, owner: str) -> tuple[int, dict]:
        fork = f"{owner}/{repo.split('/')[1]}"
        api = {"github": "", "forgejo": "/api/v1"}[forge]
        answer = {"id": _number_of(fork), "full_name": fork, "fork": True, "default_branch": "main",
                  "clone_url": f"{self.url}/git/{fork}.git", "owner": {"login": owner},
                  "parent": {"full_name": repo}, "source": {"full_name": repo}}
        with self._pull_lock:
            if fork not in self.forks:
                self._copy_repository(self._context(forge, repo)["git_name"], fork)
            self.forks[fork] = repo
            self._fork_route(f"{api}/repos/{fork}", (200, answer))
        return 202, answer

    def gitlab_forks(self, project_id: int, path: str, owner: str = "pidispatch-bot") -> None:
        """GitLab's fork API for the project (docs.gitlab.com/api/project_forks): a POST makes `owner`'s fork, a bare
        copy of the served repository (409 once it exists, the fork then listed by GET .../forks?owned=true); a
        merge request created on the fork with `target_project_id` lands in the project."""
        self.routes[("POST", f"/api/v4/projects/{project_id}/fork")] = \
            lambda request: self._gitlab_fork(project_id, path, owner)

    def _gitlab_fork(self, project_id: int, path: str, owner: str) -> tuple[int, dict]:
        fork_path = f"{owner}/{path.split('/')[-1]}"
        fork_id = _number_of(fork_path)
        answer = {"id": fork_id, "path_with_namespace": fork_path, "default_branch": "main",
                  "http_url_to_repo": f"{self.url}/git/{fork_path}.git", "import_status": "finished",
                  "forked_from_project": {"id": project_id, "path_with_namespace": path}}

        def merge_request(request):
            body = request["body"] if isinstance(request["body"], dict) else {}
            if str(body.get("target_project_id")) != str(project_id):
                return 400, {"message": "target_project_id is not the fork's parent"}
            return self._gitlab_create({**request, "body": body}, str(project_id), fork=fork_path)

        with self._pull_lock:
            if fork_path in self.forks:
                return 409, {"message": {"name": ["has already been taken"], "path": ["has already been taken"]}}
            self._copy_repository(self._context("gitlab", str(project_id)).get("git_name", path), fork_path)
            self.forks[fork_path] = str(project_id)
            self._fork_route(f"/api/v4/projects/{fork_id}", (200, answer))
            self._fork_route(f"/api/v4/projects/{project_id}/forks", (200, [answer]))
            self._fork_route(("POST", f"/api/v4/projects/{fork_id}/merge_requests"), merge_request)
        return 201, answer

    def serve_azure_forks(self, fork_project: str = AZURE_FORK_PROJECT) -> None:
        """Azure DevOps' fork create (POST {project}/_apis/git/repositories with a `parentRepository`,
        learn.microsoft.com rest/api/azure/devops/git/repositories/create) in the deployment's `fork_project`: a bare
        copy of the parent's served repository, answered as the fork; its name taken answers 409 (TF400948); a pull
        request whose `forkSource` is the fork comes from it."""
        self.route("POST", rf"/{re.escape(fork_project)}/_apis/git/repositories",
                   lambda request: self._azure_fork(request, fork_project))

    def _azure_fork(self, request, fork_project: str) -> tuple[int, dict]:
        body = request["body"] if isinstance(request["body"], dict) else {}
        parent, name = (body.get("parentRepository") or {}).get("id"), body.get("name")
        if not isinstance(parent, str) or not isinstance(name, str) or not name:
            return 400, _azure_error("The value of parentRepository is required.", "InvalidArgumentValueException")
        fork = f"{fork_project}/{name}"
        fork_id = str(uuid.uuid5(uuid.NAMESPACE_URL, fork))
        answer = {"id": fork_id, "name": name, "isFork": True, "defaultBranch": "refs/heads/main",
                  "remoteUrl": f"{self.url}/git/{fork}.git", "project": {"id": fork_id, "name": fork_project},
                  "parentRepository": {"id": parent, "project": {"id": AZURE_PROJECT_ID}}}
        with self._pull_lock:
            if fork in self.forks:
                return 409, _azure_error(f"TF400948: A Git repository with the name {name} already exists.",
                                         "GitRepositoryNameAlreadyExistsException")
            self._copy_repository(self._context("azure", parent)["git_name"], fork)
            self.forks[fork] = parent
            self._fork_route(f"/{fork_project}/_apis/git/repositories/{name}", (200, answer))
        return 201, answer

    def _fork_route(self, key, answer) -> None:
        self.routes[key] = answer
        self.fork_routes.append(key)

    def forget_forks(self) -> None:
        """No fork any more: their repositories and routes gone (tests that share one stand-in start afresh)."""
        for fork in self.forks:
            if self.git_root is not None:
                subprocess.run(["rm", "-rf", str(self.git_root / f"{fork}.git")], check=True)
        for key in self.fork_routes:
            self.routes.pop(key, None)
        self.forks.clear()
        self.fork_routes.clear()

    def _copy_repository(self, git_name: str, copy_name: str) -> None:
        """A fork's repository: a bare clone of the served one (nothing to copy where no git is served)."""
        if self.git_root is None:
            return
        origin, copy = self.git_root / f"{git_name}.git", self.git_root / f"{copy_name}.git"
        if origin.is_dir() and not copy.exists():
            subprocess.run(["git", "clone", "-q", "--bare", str(origin), str(copy)], check=True, capture_output=True)

    def github_app(self, app_id: str, installation_id: str, public_key, account: str, token: str = "ghs_jobtoken"):
        """The installation-token exchange, checking the App's RS256 JWT as GitHub does; each minted token is
        `<token>-<n>` and is listed in `self.minted` with the installation and the repositories it was scoped to."""
        self.minted: list[dict] = []
        self._app = (app_id, public_key, token)
        self.routes[("POST", f"/app/installations/{installation_id}/access_tokens")] = \
            lambda request: self._app_exchange(request, installation_id, account)
        self.routes[("DELETE", "/installation/token")] = (204, None)
        self.routes["/app"] = (200, {"id": int(app_id), "slug": "pi-dispatch-test", "name": "pi dispatch test"})

    def github_app_installed_on(self, organization: str, installation_id: str) -> None:
        """The App (`github_app` first) installed on another organization too, on all its repositories: `GET
        /orgs/{org}/installation` (with the App's JWT) names the installation, whose tokens it mints."""
        def installation(request):
            if self._app_claims(request) is None:
                return 401, {"message": "A JSON web token could not be decoded"}
            return 200, {"id": int(installation_id), "account": {"login": organization, "type": "Organization"},
                         "repository_selection": "all"}

        self.routes[f"/orgs/{organization}/installation"] = installation
        self.routes[("POST", f"/app/installations/{installation_id}/access_tokens")] = \
            lambda request: self._app_exchange(request, installation_id, organization)

    def _app_claims(self, request) -> dict | None:
        import jwt

        app_id, public_key, _ = self._app
        scheme, _, presented = request["headers"].get("authorization", "").partition(" ")
        try:
            claims = jwt.decode(presented, public_key, algorithms=["RS256"], options={"require": ["iat", "exp", "iss"]})
        except jwt.PyJWTError:
            return None
        if scheme != "Bearer" or str(claims["iss"]) != app_id or claims["exp"] - claims["iat"] > 600:
            return None
        return claims

    def _app_exchange(self, request, installation_id: str, account: str):
        if self._app_claims(request) is None:
            return 401, {"message": "A JSON web token could not be decoded"}
        names = (request["body"] or {}).get("repositories") or []
        minted = {"token": f"{self._app[2]}-{len(self.minted) + 1}", "installation": installation_id,
                  "repositories": [f"{account}/{n}" for n in names],
                  "permissions": (request["body"] or {}).get("permissions")}
        self.minted.append(minted)
        return 201, {"token": minted["token"], "expires_at": "2099-01-01T00:00:00Z",
                     "permissions": minted["permissions"] or {"contents": "write", "issues": "write"},
                     "repository_selection": "selected" if names else "all",
                     "repositories": [{"id": 1, "full_name": name} for name in minted["repositories"]]}

    def gitlab_project(self, project_id: int, path: str, sha: str, *, branch: str = "main", protected: bool = True):
        self.routes[f"/api/v4/projects/{project_id}"] = (200, {
            "id": project_id, "path_with_namespace": path, "default_branch": branch,
            "http_url_to_repo": f"{self.url}/git/{path}.git", "ssh_url_to_repo": f"git@example.com:{path}.git"})
        self.routes[f"/api/v4/projects/{project_id}/repository/branches/{branch}"] = (200, {
            "name": branch, "commit": {"id": sha, "short_id": sha[:8], "title": "initial"}, "merged": False,
            "protected": protected, "developers_can_push": False, "developers_can_merge": False, "default": True})
        self.route("POST", rf"/api/v4/projects/{project_id}/(issues|merge_requests)/\d+/notes",
                   (201, {"id": 302, "body": "", "author": {"id": 900001}}))
        self._pull_repository("gitlab", project_id, path=path, git_name=path)
        self._gitlab_pull_routes(str(project_id))
        self.gitlab_forks(project_id, path)

    def forgejo_repository(self, repo: str, sha: str, *, branch: str = "main", protected: bool = True):
        self.routes[f"/api/v1/repos/{repo}"] = (200, {
            "id": 7, "full_name": repo, "default_branch": branch, "empty": False,
            "clone_url": f"{self.url}/git/{repo}.git"})
        self.routes[f"/api/v1/repos/{repo}/branches/{branch}"] = (200, {
            "name": branch, "commit": {"id": sha, "message": "initial\n"}, "protected": protected,
            "user_can_push": True, "user_can_merge": True})
        self.route("POST", rf"/api/v1/repos/{re.escape(repo)}/issues/\d+/comments", (201, {"id": 11, "body": ""}))
        self._pull_repository("forgejo", repo, git_name=repo)
        self._forgejo_pull_routes(re.escape(repo))
        self.add_forks("forgejo", repo)

    def azure_repository(self, project_id: str, repository_id: str, name: str, sha: str, *,
                         blocking_policy: bool = True, project_name: str = "Fabrikam"):
        host = urlsplit(self.url).netloc
        base = f"/{project_id}/_apis/git/repositories"
        self.routes[f"{base}/{repository_id}"] = (200, {
            "id": repository_id, "name": name, "defaultBranch": "refs/heads/main",
            "remoteUrl": f"http://fabrikam@{host}/git/{name}.git", "project": {"id": project_id}})
        self.routes[f"{base}/{repository_id}/refs"] = (200, {"count": 2, "value": [
            {"name": "refs/heads/main-old", "objectId": "1" * 40},
            {"name": "refs/heads/main", "objectId": sha}]})
        self.routes[f"/{project_id}/_apis/git/policy/configurations"] = (200, {"count": 1, "value": [
            {"id": 1, "isEnabled": True, "isBlocking": blocking_policy, "isDeleted": False,
             "type": {"displayName": "Minimum number of reviewers"}, "settings": {"minimumApproverCount": 1}}]})
        self.route("POST", rf"/{project_id}/_apis/wit/workItems/\d+/comments", (200, {"id": 5, "text": ""}))
        self.route("POST", rf"{base}/{repository_id}/pullRequests/\d+/threads", (200, {"id": 6}))
        self._pull_repository("azure", repository_id, project_id=project_id, project_name=project_name, name=name,
                              git_name=name)
        self._azure_pull_routes(re.escape(project_id), re.escape(repository_id))
        self.serve_azure_forks()

    # --- pull/merge requests: one store, answered in each forge's own shapes ---

    def add_pull_request(self, forge: str, repo, *, head: str, sha: str, number: int | None = None,
                         base: str = "main", fork: str | None = None, state: str = "open", title: str = "A change",
                         body: str = "", draft: bool = False, author: dict | None = None) -> dict:
        """An existing pull/merge request, as if someone had opened it: `repo` as the repository helper named
        it (owner/name; the GitLab project id; the Azure repository id), `head` its branch at `sha`, `fork` the
        head repository's name when it lives in a fork, `state` open, closed or merged. When the forge serves
        the repository's git (`serve_git`, a bare `<name>.git`), the fetch ref is made there at `sha`
        (refs/pull/<n>/head, refs/merge-requests/<n>/head, Azure's refs/heads/<head> or refs/pull/<n>/merge).
        Returns the record (also in `pull_requests`)."""
        assert state in ("open", "closed", "merged")
        with self._pull_lock:
            record = self._new_pull(forge, str(repo), head=head, base=base, title=title, body=body, draft=draft,
                                    issues=[] if forge == "azure" else _closing_keywords(body), sha=sha, fork=fork,
                                    state=state, created=False, number=number,
                                    **({"author": author} if author else {}))
        bare = self._bare(forge, str(repo))
        if bare is not None:
            git(bare, "update-ref", _fetch_ref(record), sha)
        return record

    @property
    def created_pull_requests(self) -> list[dict]:
        """The records of those opened through a forge's API, oldest first."""
        return [pr for pr in self.pull_requests if pr["created"]]

    def pulls_of(self, forge: str, repo) -> list[dict]:
        """The records of one repository's pull/merge requests, oldest first."""
        return [pr for pr in self.pull_requests if pr["forge"] == forge and pr["repo"].lower() == str(repo).lower()]

    def _pull_repository(self, forge: str, key, **context) -> None:
        self._pull_repositories[(forge, str(key).lower())] = {"key": str(key), **context}

    def _context(self, forge: str, key: str) -> dict:
        return self._pull_repositories.get((forge, key.lower())) or {"key": key, "git_name": self.any_git_name or key}

    def _bare(self, forge: str, key: str) -> Path | None:
        bare = self.git_root / f"{self._context(forge, key)['git_name']}.git" if self.git_root else None
        return bare if bare is not None and bare.is_dir() else None

    def _new_pull(self, forge: str, repo: str, *, number: int | None, **fields) -> dict:
        taken = [pr["number"] for pr in self.pulls_of(forge, repo)]
        if number is None:
            number = max(taken, default=40) + 1  # past the tests' issue numbers, as a busy repository's are
        assert number not in taken, f"{forge} {repo} already has #{number}"
        record = {"forge": forge, "repo": repo, "number": number, **fields}
        self.pull_requests.append(record)
        return record

    def _open_duplicate(self, forge: str, repo: str, head: str, base: str, fork: str | None = None) -> dict | None:
        return next((pr for pr in self.pulls_of(forge, repo) if pr["state"] == "open" and pr["fork"] == fork
                     and pr["head"] == head and pr["base"] == base), None)

    def _head_sha(self, forge: str, repo: str, branch: str) -> str:
        """The branch's tip in the served bare repository, else a stand-in commit id derived from its name."""
        bare = self._bare(forge, repo)
        if bare is not None:
            try:
                return git(bare, "rev-parse", "--verify", "-q", f"refs/heads/{branch}^{{commit}}")
            except subprocess.CalledProcessError:
                pass
        return hashlib.sha1(f"{repo}:{branch}".encode()).hexdigest()

    def _created(self, forge: str, repo: str, *, head: str, base: str, title: str, body: str, draft: bool,
                 issues: list[int], fork: str | None = None) -> dict:
        sha = _tip(self.git_root / f"{fork}.git", head) if fork and self.git_root else self._head_sha(forge, repo, head)
        return self._new_pull(forge, repo, number=None, head=head, base=base, title=title, body=body, draft=draft,
                              issues=issues, sha=sha, fork=fork, state="open", created=True)

    def _pull_routes(self, routes) -> None:
        """(method, path regex with named groups, handler(request, **groups))."""
        for method, pattern, handler in routes:
            compiled = re.compile(pattern)
            self.route(method, pattern,
                       lambda request, compiled=compiled, handler=handler:
                       handler(request, **compiled.fullmatch(request["path"]).groupdict()))

    def _find(self, forge: str, repo: str, number: str) -> dict | None:
        return next((pr for pr in self.pulls_of(forge, repo) if pr["number"] == int(number)), None)

    def _asked(self, forge: str, repo: str, number: str) -> dict | None:
        """The pull/merge request a forge's API is asked for; with `pulls_on_demand`, one it does not know yet is
        opened then, as someone would have: its head branch `sample/<n>`, one commit on top of `main` adding
        `SAMPLE-<n>.md` in the served repository."""
        found = self._find(forge, repo, number)
        bare = self._bare(forge, repo)
        if found is not None or not self.pulls_on_demand or bare is None:
            return found
        head = f"sample/{number}"
        sha = _commit_on_main(bare, head, f"SAMPLE-{number}.md", f"A sample change for #{number}.\n")
        try:
            return self.add_pull_request(forge, repo, head=head, sha=sha, number=int(number),
                                         title=f"A sample change (#{number})", body="Made by the demo forge.")
        except AssertionError:  # another request made it meanwhile
            return self._find(forge, repo, number)

    # --- the forge's web pages, for people: an issue, a pull/merge request (its branch, commits and diff) ---

    def add_issue(self, forge: str, repo: str, number: int, *, title: str, body: str = "") -> dict:
        """An issue the forge's page shows (`repo` as its page's path names it: owner/name, the GitLab project's
        path, Azure's project/repository)."""
        issue = {"forge": forge, "repo": repo, "number": int(number), "title": title, "body": body}
        self.issues[(forge, repo.lower(), int(number))] = issue
        return issue

    def serve_pages(self) -> None:
        """Each forge's page paths: GitHub `/<owner>/<repo>/issues/<n>` and `/pull/<n>`, Forgejo `/pulls/<n>`,
        GitLab `/<path>/-/issues/<n>` and `/-/merge_requests/<n>`, Azure DevOps `/<project>/_git/<repo>/pullrequest/
        <n>` and `/<project>/_workitems/edit/<n>`. Everything shown is escaped: issue text is anyone's."""
        n = r"(?P<number>\d+)"
        self._pull_routes([
            ("GET", rf"/(?P<repo>[^/]+/[^/]+)/issues/{n}", lambda request, repo, number:
                self._issue_page(("github", "forgejo"), repo, int(number))),
            ("GET", rf"/(?P<repo>[^/]+/[^/]+)/pull/{n}", lambda request, repo, number:
                self._pull_page("github", repo, int(number))),
            ("GET", rf"/(?P<repo>[^/]+/[^/]+)/pulls/{n}", lambda request, repo, number:
                self._pull_page("forgejo", repo, int(number))),
            ("GET", rf"/(?P<repo>.+?)/-/issues/{n}", lambda request, repo, number:
                self._issue_page(("gitlab",), repo, int(number))),
            ("GET", rf"/(?P<repo>.+?)/-/merge_requests/{n}", lambda request, repo, number:
                self._pull_page("gitlab", repo, int(number))),
            ("GET", rf"/(?P<project>[^/]+)/_git/(?P<name>[^/]+)/pullrequest/{n}", lambda request, project, name, number:
                self._pull_page("azure", f"{project}/{name}", int(number))),
            ("GET", rf"/(?P<project>[^/]+)/_workitems/edit/{n}", lambda request, project, number:
                self._issue_page(("azure",), project, int(number))),
        ])

    def _page_path(self, pr: dict) -> str:
        """Where a pull/merge request's page is: its repository as people name it (owner/name; the GitLab project's
        path; Azure's project/repository names)."""
        context = self._context(pr["forge"], pr["repo"])
        if pr["forge"] == "gitlab":
            return context.get("path", f"group/project-{pr['repo']}")
        if pr["forge"] == "azure":
            return f"{context.get('project_name', 'Fabrikam')}/{context.get('name', 'repo')}"
        return pr["repo"]

    def _pull_of_page(self, forge: str, path: str, number: int) -> dict | None:
        found = [pr for pr in self.pull_requests if pr["forge"] == forge and pr["number"] == number]
        named = [pr for pr in found if self._page_path(pr).lower() == path.lower()]
        # The stand-in that serves any repository (make run's) may know it by another name (its id): the number
        # decides then.
        return (named or found or [None])[-1]

    def _pull_page(self, forge: str, path: str, number: int):
        pr = self._pull_of_page(forge, path, number)
        noun = "merge request" if forge == "gitlab" else "pull request"
        if pr is None:
            return _html_page(404, f"No {noun} #{number}", f"<p>{html.escape(path)} has no {noun} #{number}.</p>")
        commits, diff = self._commits_and_diff(pr)
        closes = ", ".join(f"#{issue}" for issue in pr["issues"]) or "no issue"
        body = (
            f"<p class=meta><span class=state>{html.escape(pr['state'])}</span>{' draft' if pr['draft'] else ''} "
            f"{noun} on {html.escape(path)}: <code>{html.escape(pr['head'])}</code> into "
            f"<code>{html.escape(pr['base'])}</code> (head {html.escape(pr['sha'][:12])}; closes {closes})</p>"
            f"<h2>Description</h2><div class=text>{html.escape(pr['body']) or '<em>none</em>'}</div>"
            f"<h2>Commits</h2><ul class=commits>"
            + "".join(f"<li><code>{html.escape(sha)}</code> {html.escape(subject)}</li>" for sha, subject in commits)
            + f"</ul><h2>Changes</h2><pre class=diff>{_diff_html(diff)}</pre>")
        return _html_page(200, f"{pr['title']} ({noun} #{number})", body)

    def _commits_and_diff(self, pr: dict) -> tuple[list[tuple[str, str]], str]:
        """The head's commits that its base lacks, and their diff, from the served bare repository."""
        bare = self._bare(pr["forge"], pr["repo"])
        if pr["fork"] and self.git_root is not None:  # a fork's branch lives in the fork's repository
            bare = self.git_root / f"{pr['fork']}.git" if (self.git_root / f"{pr['fork']}.git").is_dir() else None
        if bare is None:
            return [], ""
        try:
            span = f"refs/heads/{pr['base']}..{pr['sha']}"
            log = git(bare, "log", "--format=%h%x09%s", span)
            diff = git(bare, "diff", f"refs/heads/{pr['base']}...{pr['sha']}")
        except subprocess.CalledProcessError:
            return [], ""
        return [tuple(line.split("\t", 1)) for line in log.splitlines() if "\t" in line], diff

    def _issue_page(self, forges: tuple[str, ...], path: str, number: int):
        issue = next((self.issues[(forge, path.lower(), number)] for forge in forges
                      if (forge, path.lower(), number) in self.issues), None)
        if (issue is None and "github" in forges and path in self.issue_feeds
                and number in self.issue_feeds[path].issues):
            issue = self.issue_feeds[path].issues[number]
        pulls = [pr for pr in self.pull_requests if pr["forge"] in forges and number in pr["issues"]
                 and (self._page_path(pr).lower() == path.lower() or pr["repo"].lower() == path.lower()
                      or (pr["forge"], pr["repo"].lower()) not in self._pull_repositories)]
        comments = [request["body"] for request in self.requests
                    if request["method"] == "POST" and isinstance(request.get("body"), dict)
                    and re.search(rf"/(?:issues|workItems)/{number}/(?:comments|notes)$", request["path"])]
        if issue is None and not comments and not pulls:
            return _html_page(404, f"No issue #{number}", f"<p>{html.escape(path)} has no issue #{number}.</p>")
        title = issue["title"] if issue else f"Issue #{number}"
        text = issue["body"] if issue else ""
        body = (f"<p class=meta>issue #{number} on {html.escape(path)}</p>"
                f"<div class=text>{html.escape(text) or '<em>no description</em>'}</div>"
                "<h2>Linked pull requests</h2><ul>"
                + "".join(f"<li>#{pr['number']} {html.escape(pr['title'])} (<code>{html.escape(pr['head'])}</code>, "
                          f"{html.escape(pr['state'])})</li>" for pr in pulls)
                + "</ul><h2>Comments</h2>"
                + ("" if comments else "<p><em>none yet</em></p>")
                + "".join(f"<div class=comment>{html.escape(str(comment.get('body') or comment.get('text') or ''))}"
                          "</div>" for comment in comments))
        return _html_page(200, f"{title} (#{number})", body)

    # GitHub: REST pulls API (docs.github.com/rest/pulls/pulls)

    def _github_pull_routes(self, repo_pattern: str) -> None:
        pulls = rf"/repos/(?P<repo>{repo_pattern})/pulls"
        self._pull_routes([("GET", pulls + r"/(?P<number>\d+)", self._github_get), ("GET", pulls, self._github_list),
                           ("POST", pulls, self._github_create)])

    def _github_json(self, pr: dict) -> dict:
        repo, number = pr["repo"], pr["number"]
        owner, head_repo = repo.split("/")[0], pr["fork"] or repo
        head_git = pr["fork"] or self._context("github", repo)["git_name"]  # the served repository it clones
        base_id = _number_of(repo)
        return {
            "url": f"{self.url}/repos/{repo}/pulls/{number}", "id": 1_000_000 + number, "number": number,
            "html_url": f"https://github.com/{repo}/pull/{number}",
            "state": "open" if pr["state"] == "open" else "closed",
            "locked": False, "title": pr["title"], "body": pr["body"], "draft": pr["draft"],
            "labels": [{"name": name} for name in pr.get("labels", [])],
            "user": pr.get("author") or {"login": "pi-dispatch[bot]", "type": "Bot"}, "merged": pr["state"] == "merged",
            "merged_at": "2024-01-02T00:00:00Z" if pr["state"] == "merged" else None,
            "created_at": "2024-01-01T00:00:00Z", "maintainer_can_modify": False,
            "head": {"label": f"{head_repo.split('/')[0]}:{pr['head']}", "ref": pr["head"], "sha": pr["sha"],
                     "user": {"login": head_repo.split("/")[0]},
                     "repo": {"id": _number_of(head_repo), "full_name": head_repo, "fork": pr["fork"] is not None,
                              "clone_url": f"{self.url}/git/{head_git}.git"}},
            "base": {"label": f"{owner}:{pr['base']}", "ref": pr["base"], "sha": "0" * 40, "user": {"login": owner},
                     "repo": {"id": base_id, "full_name": repo, "fork": False}},
        }

    def _github_get(self, request, repo, number):
        pr = self._asked("github", repo, number)
        if pr is None:
            return 404, {"message": "Not Found", "status": "404",
                         "documentation_url": "https://docs.github.com/rest/pulls/pulls#get-a-pull-request"}
        return 200, self._github_json(pr)

    def _github_list(self, request, repo):
        query = {name: values[-1] for name, values in request["query"].items()}
        state, head, base = query.get("state", "open"), query.get("head"), query.get("base")
        found = [pr for pr in self.pulls_of("github", repo)
                 if (state == "all" or (pr["state"] == "open") == (state == "open"))
                 and (head is None or head == f"{(pr['fork'] or repo).split('/')[0]}:{pr['head']}")
                 and (base is None or base == pr["base"])]
        return 200, [self._github_json(pr) for pr in _page(found, query, "per_page", "page", 30)]

    def _github_create(self, request, repo):
        body = request["body"] if isinstance(request["body"], dict) else {}
        missing = [name for name in ("head", "base", "title") if not body.get(name)]
        if missing:
            return 422, _github_invalid({"resource": "PullRequest", "field": missing[0], "code": "missing_field"})
        owner, _, head = str(body["head"]).rpartition(":")
        fork = f"{owner}/{repo.split('/')[1]}" if owner else ""
        from_fork = fork.lower() != repo.lower() and self.forks.get(fork, "").lower() == repo.lower()
        if owner and owner.lower() != repo.split("/")[0].lower() and not from_fork:
            return 422, _github_invalid({"resource": "PullRequest", "field": "head", "code": "invalid"})
        if head == body["base"]:
            return 422, _github_invalid({"resource": "PullRequest", "code": "custom",
                                         "message": f"No commits between {body['base']} and {head}"})
        if len(body.get("body") or "") > 65536:
            return 422, _github_invalid({"resource": "PullRequest", "code": "custom", "field": "body",
                                         "message": "body is too long (maximum is 65536 characters)"})
        with self._pull_lock:
            if self._open_duplicate("github", repo, head, body["base"], fork if from_fork else None):
                message = f"A pull request already exists for {owner or repo.split('/')[0]}:{head}."
                return 422, _github_invalid({"resource": "PullRequest", "code": "custom", "message": message})
            pr = self._created("github", repo, head=head, base=body["base"], title=body["title"],
                               body=body.get("body") or "", draft=body.get("draft") is True,
                               issues=_closing_keywords(body.get("body") or ""), fork=fork if from_fork else None)
        return 201, self._github_json(pr)

    # GitLab: merge requests API (docs.gitlab.com/api/merge_requests)

    def _gitlab_pull_routes(self, project: str) -> None:
        requests = rf"/api/v4/projects/(?P<repo>{project})/merge_requests"
        self._pull_routes([("GET", requests + r"/(?P<number>\d+)", self._gitlab_get),
                           ("GET", requests, self._gitlab_list), ("POST", requests, self._gitlab_create)])

    def _gitlab_json(self, pr: dict) -> dict:
        project, iid = int(pr["repo"]), pr["number"]
        path = self._context("gitlab", pr["repo"]).get("path", f"group/project-{project}")
        source = project if pr["fork"] is None else _number_of(pr["fork"])
        draft = bool(GITLAB_DRAFT.match(pr["title"])) or pr["draft"]
        return {
            "id": 500_000 + iid, "iid": iid, "project_id": project, "title": pr["title"], "description": pr["body"],
            "state": {"open": "opened", "closed": "closed", "merged": "merged"}[pr["state"]],
            "created_at": "2024-01-01T00:00:00.000Z", "target_branch": pr["base"], "source_branch": pr["head"],
            "source_project_id": source, "target_project_id": project, "author": {"id": 900001, "username": "pi-bot"},
            "draft": draft, "work_in_progress": draft, "merge_status": "can_be_merged",
            "detailed_merge_status": "mergeable", "sha": pr["sha"], "merge_commit_sha": None,
            "web_url": f"https://gitlab.example.com/{path}/-/merge_requests/{iid}",
            "references": {"short": f"!{iid}", "relative": f"!{iid}", "full": f"{path}!{iid}"},
        }

    def _gitlab_get(self, request, repo, number):
        pr = self._asked("gitlab", repo, number)
        return (404, {"message": "404 Not found"}) if pr is None else (200, self._gitlab_json(pr))

    def _gitlab_list(self, request, repo):
        query = {name: values[-1] for name, values in request["query"].items()}
        state = query.get("state", "all")  # GitLab lists every state unless told
        states = {"opened": "open", "closed": "closed", "merged": "merged"}
        found = [pr for pr in self.pulls_of("gitlab", repo)
                 if (state == "all" or states.get(state) == pr["state"])
                 and query.get("source_branch", pr["head"]) == pr["head"]
                 and query.get("target_branch", pr["base"]) == pr["base"]]
        return 200, [self._gitlab_json(pr) for pr in _page(found, query, "per_page", "page", 20)]

    def _gitlab_create(self, request, repo, fork: str | None = None):
        body = request["body"] if isinstance(request["body"], dict) else {}
        missing = [name for name in ("source_branch", "target_branch", "title") if not body.get(name)]
        if missing:
            return 400, {"error": f"{missing[0]} is missing"}
        if len(body["title"]) > 255:
            return 400, {"message": {"title": ["is too long (maximum is 255 characters)"]}}
        if len(body.get("description") or "") > 1_000_000:
            return 400, {"message": {"description": ["is too long (maximum is 1000000 characters)"]}}
        head, base = body["source_branch"], body["target_branch"]
        with self._pull_lock:
            existing = self._open_duplicate("gitlab", repo, head, base, fork)
            if existing:
                return 409, {"message": [f"Another open merge request already exists for this source branch: "
                                         f"!{existing['number']}"]}
            pr = self._created("gitlab", repo, head=head, base=base, title=body["title"],
                               body=body.get("description") or "", draft=bool(GITLAB_DRAFT.match(body["title"])),
                               issues=_closing_keywords(body.get("description") or ""), fork=fork)
        return 201, self._gitlab_json(pr)

    # Forgejo / Gitea: the v1 API's swagger (repoGetPullRequest, repoListPullRequests, repoCreatePullRequest)

    def _forgejo_pull_routes(self, repo_pattern: str) -> None:
        pulls = rf"/api/v1/repos/(?P<repo>{repo_pattern})/pulls"
        self._pull_routes([("GET", pulls + r"/(?P<number>\d+)", self._forgejo_get),
                           ("GET", pulls, self._forgejo_list), ("POST", pulls, self._forgejo_create)])

    def _forgejo_json(self, pr: dict) -> dict:
        repo, number = pr["repo"], pr["number"]
        head_repo = pr["fork"] or repo
        web = f"{self.url}/{repo}/pulls/{number}"

        def branch(name, sha, full):
            return {"label": name, "ref": name, "sha": sha, "repo_id": _number_of(full),
                    "repo": {"id": _number_of(full), "full_name": full, "fork": full != repo}}

        return {
            "id": 70_000 + number, "url": web, "number": number, "user": {"id": 900002, "login": "pi-bot"},
            "title": pr["title"], "body": pr["body"], "state": "open" if pr["state"] == "open" else "closed",
            "draft": pr["title"].lower().startswith(FORGEJO_WIP) or pr["draft"], "is_locked": False, "html_url": web,
            "diff_url": f"{web}.diff", "patch_url": f"{web}.patch", "mergeable": True,
            "merged": pr["state"] == "merged", "merge_commit_sha": None, "allow_maintainer_edit": False,
            "head": branch(pr["head"], pr["sha"], head_repo), "base": branch(pr["base"], "0" * 40, repo),
            "merge_base": "0" * 40, "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-01T00:00:00Z",
        }

    def _forgejo_get(self, request, repo, number):
        pr = self._asked("forgejo", repo, number)
        if pr is None:
            return 404, {"errors": ["pull request does not exist"], "message": "The target couldn't be found.",
                         "url": f"{self.url}/api/swagger"}
        return 200, self._forgejo_json(pr)

    def _forgejo_list(self, request, repo):
        query = {name: values[-1] for name, values in request["query"].items()}
        state = query.get("state", "open")
        found = [pr for pr in self.pulls_of("forgejo", repo)
                 if state == "all" or (pr["state"] == "open") == (state == "open")]
        if query.get("sort") == "recentupdate":
            found = found[::-1]  # the stand-in's newest is its most recently updated
        page = _page(found, query, "limit", "page", 30, most=50)  # DEFAULT_PAGING_NUM, MAX_RESPONSE_ITEMS
        return 200, [self._forgejo_json(pr) for pr in page], {"X-Total-Count": str(len(found))}

    def _forgejo_create(self, request, repo):
        body = request["body"] if isinstance(request["body"], dict) else {}
        missing = [name for name in ("head", "base", "title") if not body.get(name)]
        if missing:
            return 422, {"message": f"[{missing[0].capitalize()}]: Required", "url": f"{self.url}/api/swagger"}
        owner, _, head = str(body["head"]).rpartition(":")
        fork = f"{owner}/{repo.split('/')[1]}" if owner else None
        if fork is not None and self.forks.get(fork, "").lower() != repo.lower():
            return 404, {"message": "The target couldn't be found.", "url": f"{self.url}/api/swagger"}
        if head == body["base"] and fork is None:
            return 422, {"message": "Invalid PullRequest: There are no changes between the head and the base",
                         "url": f"{self.url}/api/swagger"}
        with self._pull_lock:
            existing = self._open_duplicate("forgejo", repo, head, body["base"], fork)
            if existing:
                return 409, {"message": f"pull request already exists for these targets [id: {existing['number']}, "
                                        f"issue_id: {existing['number']}, head_repo_id: {_number_of(repo)}, "
                                        f"base_repo_id: {_number_of(repo)}, head_branch: {body['head']}, "
                                        f"base_branch: {body['base']}]", "url": f"{self.url}/api/swagger"}
            pr = self._created("forgejo", repo, head=head, base=body["base"], title=body["title"],
                               body=body.get("body") or "",
                               draft=body["title"].lower().startswith(FORGEJO_WIP),
                               issues=_closing_keywords(body.get("body") or ""), fork=fork)
        return 201, self._forgejo_json(pr)

    # Azure DevOps: Git Pull Requests API 7.1 (learn.microsoft.com/rest/api/azure/devops/git/pull-requests)

    def _azure_pull_routes(self, project: str, repository: str) -> None:
        pulls = rf"/{project}/_apis/git/repositories/(?P<repo>{repository})/(?i:pullrequests)"
        self._pull_routes([("GET", pulls + r"/(?P<number>\d+)", self._azure_get), ("GET", pulls, self._azure_list),
                           ("POST", pulls, self._azure_create)])

    def _azure_json(self, pr: dict) -> dict:
        context = self._context("azure", pr["repo"])
        repository_id, number = context["key"], pr["number"]
        project = {"id": context.get("project_id", AZURE_PROJECT_ID), "name": context.get("project_name", "Fabrikam")}
        api = f"{self.url}/{project['id']}/_apis/git/repositories/{repository_id}"
        answer = {
            "repository": {"id": repository_id, "name": context.get("name", "repo"), "url": api, "project": project,
                           "remoteUrl": f"{self.url}/{project['name']}/_git/{context.get('name', 'repo')}"},
            "pullRequestId": number, "codeReviewId": number,
            "status": {"open": "active", "closed": "abandoned", "merged": "completed"}[pr["state"]],
            "createdBy": {"id": "0f0f0f0f-1111-2222-3333-444444444444", "displayName": "pi bot"},
            "creationDate": "2024-01-01T00:00:00.0000000Z", "title": pr["title"], "description": pr["body"],
            "sourceRefName": f"refs/heads/{pr['head']}", "targetRefName": f"refs/heads/{pr['base']}",
            "mergeStatus": "succeeded", "isDraft": pr["draft"], "mergeId": str(uuid.uuid5(uuid.NAMESPACE_URL, api)),
            "lastMergeSourceCommit": {"commitId": pr["sha"], "url": f"{api}/commits/{pr['sha']}"},
            "lastMergeTargetCommit": {"commitId": "0" * 40, "url": f"{api}/commits/{'0' * 40}"},
            "reviewers": [], "url": f"{api}/pullRequests/{number}", "supportsIterations": True,
            "artifactId": f"vstfs:///Git/PullRequestId/{project['id']}%2f{repository_id}%2f{number}",
        }
        if pr["fork"] is not None:
            fork_project, _, fork_name = pr["fork"].rpartition("/")
            answer["forkSource"] = {"name": f"refs/heads/{pr['head']}", "repository": {
                "id": str(uuid.uuid5(uuid.NAMESPACE_URL, pr["fork"])), "name": fork_name,
                "project": {"name": fork_project} if fork_project else project}}
        return answer

    def _azure_get(self, request, repo, number):
        pr = self._asked("azure", repo, number)
        if pr is None:
            return 404, _azure_error("The pull request was not found.", "GitPullRequestNotFoundException")
        return 200, self._azure_json(pr)

    def _azure_list(self, request, repo):
        query = {name: values[-1] for name, values in request["query"].items()}
        status = query.get("searchCriteria.status", "active")
        statuses = {"active": "open", "abandoned": "closed", "completed": "merged"}
        source, target = query.get("searchCriteria.sourceRefName"), query.get("searchCriteria.targetRefName")
        source_repository = query.get("searchCriteria.sourceRepositoryId")
        found = [pr for pr in self.pulls_of("azure", repo)
                 if (status == "all" or statuses.get(status) == pr["state"])
                 and source in (None, f"refs/heads/{pr['head']}") and target in (None, f"refs/heads/{pr['base']}")
                 and source_repository in (None, self._azure_source_id(pr))]
        skip, top = int(query.get("$skip", 0)), int(query.get("$top", 101))  # 101: the service's default page
        value = [self._azure_json(pr) for pr in found[skip:skip + top]]
        return 200, {"value": value, "count": len(value)}

    def _azure_create(self, request, repo):
        body = request["body"] if isinstance(request["body"], dict) else {}
        for name in ("sourceRefName", "targetRefName", "title"):
            if not body.get(name):
                return 400, _azure_error(f"The value of {name} is required.", "InvalidArgumentValueException")
        if len(body.get("description") or "") > 4000:  # the service's limit (its wording is not copied here)
            return 400, _azure_error("The description is longer than 4000 characters.",
                                     "InvalidArgumentValueException")
        head = body["sourceRefName"].removeprefix("refs/heads/")
        base = body["targetRefName"].removeprefix("refs/heads/")
        fork_id = ((body.get("forkSource") or {}).get("repository") or {}).get("id")
        fork = None
        if fork_id is not None:
            fork = next((name for name, parent in self.forks.items()
                         if repo.lower() in (parent.lower(), str(self._context("azure", parent).get("name")).lower())
                         and str(uuid.uuid5(uuid.NAMESPACE_URL, name)) == str(fork_id).lower()), None)
            if fork is None:
                return 400, _azure_error("The fork source is not a fork of the target repository.",
                                         "InvalidArgumentValueException")
        with self._pull_lock:
            if self._open_duplicate("azure", repo, head, base, fork):
                return 409, _azure_error("TF401179: An active pull request for the source and target branch already "
                                         "exists.", "GitPullRequestExistsException")
            pr = self._created("azure", repo, head=head, base=base, title=body["title"],
                               body=body.get("description") or "", draft=body.get("isDraft") is True,
                               issues=[int(ref["id"]) for ref in body.get("workItemRefs") or []
                                       if isinstance(ref, dict) and str(ref.get("id", "")).isdigit()], fork=fork)
        return 201, self._azure_json(pr)

    def _azure_source_id(self, pr: dict) -> str:
        """The id of the repository a pull request's branch is in: its fork's, else its own repository's."""
        if pr["fork"]:
            return str(uuid.uuid5(uuid.NAMESPACE_URL, pr["fork"]))
        return self._context("azure", pr["repo"])["key"]


GITLAB_DRAFT = re.compile(r"^\s*(?:\[draft\]|\(draft\)|draft:)", re.IGNORECASE)  # the title marks a draft
FORGEJO_WIP = ("wip:", "[wip]")  # [repository.pull-request] WORK_IN_PROGRESS_PREFIXES' default
# GitHub's, GitLab's and Forgejo's closing keywords before an issue reference, one per line.
CLOSING = re.compile(r"^\s*(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\s*:?\s+#(\d+)\b", re.IGNORECASE | re.MULTILINE)


def _closing_keywords(text: str) -> list[int]:
    return [int(number) for number in CLOSING.findall(text)]


class GitHubIssueFeeds:
    """One repository's issues as GitHub's REST API serves them to a poller (docs.github.com/rest/issues):
    `GET /repos/{repo}/issues/events` (newest first, paged), `/issues/comments` (`since`, `sort=updated`,
    `direction=asc`), `/issues/{n}`, and the pulls list, each with ETags. Ids grow as GitHub's do."""

    def __init__(self, forge: FakeForge, repo: str):
        self.forge, self.repo = forge, repo
        self.issues: dict[int, dict] = {}
        self.events: list[dict] = []
        self.comments: list[dict] = []
        self._next_id = 30_000_000_000  # GitHub's event and comment ids are past 2**32 these days
        base = rf"/repos/{re.escape(repo)}"
        forge.conditional += [re.compile(base + tail) for tail in (
            r"/issues/events", r"/issues/comments", r"/issues/\d+", r"/pulls", r"/pulls/\d+")]
        forge.routes[f"/repos/{repo}/issues/events"] = self._events
        forge.routes[f"/repos/{repo}/issues/comments"] = self._comments
        forge.route("GET", base + r"/issues/(?P<number>\d+)", self._issue)
        forge.github_repository(repo, "0" * 40)

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    @staticmethod
    def _now() -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def open_issue(self, number: int, *, title: str = "A bug", body: str = "", labels=(),
                   author: dict | None = None) -> dict:
        issue = {"id": 9_000_000 + number, "number": number, "title": title, "body": body, "state": "open",
                 "labels": [{"name": name} for name in labels], "user": author or {"login": "someone", "id": 1},
                 "html_url": f"https://github.com/{self.repo}/issues/{number}"}
        self.issues[number] = issue
        return issue

    def _issue_json(self, number: int) -> dict:
        issue = self.issues.get(number)
        if issue is None:
            pull = self.forge._find("github", self.repo, str(number))
            issue = {"id": 9_000_000 + number, "number": number, "title": pull["title"], "body": pull["body"],
                     "state": "open" if pull["state"] == "open" else "closed",
                     "labels": [{"name": name} for name in pull.get("labels", [])],
                     "user": pull.get("author") or {"login": "someone", "id": 1},
                     "pull_request": {"url": f"{self.forge.url}/repos/{self.repo}/pulls/{number}"}}
        return dict(issue)

    def label(self, number: int, name: str, actor: dict) -> dict:
        """Someone labels issue (or pull request) `number`: the label is on it, and an event says so."""
        labels = self.issues[number]["labels"] if number in self.issues else \
            self.forge._find("github", self.repo, str(number)).setdefault("labels", [])
        if number in self.issues:
            labels.append({"name": name})
        else:
            labels.append(name)
        return self._event("labeled", number, actor, label={"name": name, "color": "ededed"})

    def close(self, number: int, actor: dict) -> dict:
        if number in self.issues:
            self.issues[number]["state"] = "closed"
        return self._event("closed", number, actor)

    def reopen(self, number: int, actor: dict) -> dict:
        if number in self.issues:
            self.issues[number]["state"] = "open"
        return self._event("reopened", number, actor)

    def _event(self, kind: str, number: int, actor: dict, **fields) -> dict:
        event = {"id": self._id(), "event": kind, "actor": actor, "created_at": self._now(),
                 "issue": self._issue_json(number), **fields}
        self.events.append(event)
        return event

    def comment(self, number: int, body: str, author: dict, association: str = "MEMBER") -> dict:
        now = self._now()
        comment = {"id": self._id(), "body": body, "user": author, "author_association": association,
                   "issue_url": f"{self.forge.url}/repos/{self.repo}/issues/{number}",
                   "html_url": f"https://github.com/{self.repo}/issues/{number}#issuecomment",
                   "created_at": now, "updated_at": now}
        self.comments.append(comment)
        return comment

    def edit_comment(self, comment: dict, body: str) -> None:
        comment.update(body=body, updated_at=self._now())

    def push(self, number: int, sha: str) -> None:
        """A new head commit on pull request `number`."""
        self.forge._find("github", self.repo, str(number))["sha"] = sha

    def _events(self, request):
        query = {name: values[-1] for name, values in request["query"].items()}
        newest_first = sorted(self.events, key=lambda event: -event["id"])
        return 200, _page(newest_first, query, "per_page", "page", 30)

    def _comments(self, request):
        query = {name: values[-1] for name, values in request["query"].items()}
        since = query.get("since", "")
        found = sorted((c for c in self.comments if c["updated_at"] >= since),
                       key=lambda c: (c["updated_at"], c["id"]), reverse=query.get("direction") == "desc")
        return 200, _page(found, query, "per_page", "page", 30)

    def _issue(self, request):
        number = int(request["path"].rsplit("/", 1)[1])
        if number not in self.issues and self.forge._find("github", self.repo, str(number)) is None:
            return 404, {"message": "Not Found"}
        return 200, self._issue_json(number)


def _number_of(name: str) -> int:
    """A stable numeric id for a repository or project name (base and fork differ)."""
    return 1000 + int(hashlib.sha256(name.lower().encode()).hexdigest()[:6], 16)


def _page(items: list, query: dict, size_name: str, page_name: str, default: int, most: int = 100) -> list:
    size = min(max(int(query.get(size_name) or default), 1), most)
    page = max(int(query.get(page_name) or 1), 1)
    return items[(page - 1) * size:page * size]


def _fetch_ref(pr: dict) -> str:
    if pr["forge"] == "gitlab":
        return f"refs/merge-requests/{pr['number']}/head"
    if pr["forge"] == "azure":
        return f"refs/heads/{pr['head']}" if pr["fork"] is None else f"refs/pull/{pr['number']}/merge"
    return f"refs/pull/{pr['number']}/head"


PAGE_STYLE = ("body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1f2328}"
              ".meta{color:#59636e}.state{background:#1f883d;color:#fff;border-radius:1em;padding:.1em .7em}"
              ".text,.comment{white-space:pre-wrap;border:1px solid #d1d9e0;border-radius:6px;padding:.8em}"
              ".comment{margin:.5em 0}pre.diff{border:1px solid #d1d9e0;border-radius:6px;padding:.8em;overflow:auto}"
              ".add{background:#dafbe1}.del{background:#ffebe9}.hunk{color:#59636e}")


def _html_page(status: int, title: str, body: str) -> tuple[int, bytes, dict]:
    """One HTML page (`title` is escaped here; `body` is HTML the caller escaped)."""
    document = (f"<!doctype html><html lang=en><meta charset=utf-8><title>{html.escape(title)}</title>"
                f"<style>{PAGE_STYLE}</style><h1>{html.escape(title)}</h1>{body}</html>")
    return status, document.encode(), {"Content-Type": "text/html; charset=utf-8"}


def _diff_html(diff: str) -> str:
    lines = []
    for line in diff.splitlines():
        kind = ("add" if line.startswith("+") and not line.startswith("+++")
                else "del" if line.startswith("-") and not line.startswith("---")
                else "hunk" if line.startswith("@@") else "")
        lines.append(f"<span class={kind}>{html.escape(line)}</span>" if kind else html.escape(line))
    return "\n".join(lines) or "<em>no changes</em>"


def _github_invalid(error: dict) -> dict:
    return {"message": "Validation Failed", "errors": [error],
            "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request", "status": "422"}


def _azure_error(message: str, type_key: str) -> dict:
    return {"$id": "1", "innerException": None, "message": message,
            "typeName": f"Microsoft.TeamFoundation.Git.Server.{type_key}, Microsoft.TeamFoundation.Git.Server",
            "typeKey": type_key, "errorCode": 0, "eventId": 3000}


# --- git repositories to clone from ----------------------------------------------------------------------------

GIT_IDENTITY = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com", "GIT_COMMITTER_NAME": "Test",
                "GIT_COMMITTER_EMAIL": "test@example.com", "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True,
                            env={**os.environ, **GIT_IDENTITY, "HOME": str(cwd)})
    return result.stdout.strip()


def make_repository(root: Path, name: str, files: dict, *, branch: str = "main") -> str:
    """A bare repository `root/<name>.git` whose `branch` is one commit holding `files` (path -> text or
    bytes; `("symlink", target)` for a link; `("exec", text)` for an executable). The commit's SHA."""
    bare = root / f"{name}.git"
    bare.parent.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "--bare", str(bare))
    return commit_files(bare, files, branch=branch)


def commit_files(bare: Path, files: dict, *, branch: str = "main") -> str:
    """Replace `branch` of `bare` by a new commit holding exactly `files` (a force-push: the old tip
    becomes unreachable). Its SHA."""
    work = bare.parent / (bare.name + f".work-{uuid.uuid4().hex[:8]}")
    git(bare.parent, "init", "-q", "-b", branch, str(work))
    for path, content in files.items():
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple) and content[0] == "symlink":
            target.symlink_to(content[1])
            continue
        if isinstance(content, tuple) and content[0] == "exec":
            target.write_text(content[1])
            target.chmod(0o755)
            continue
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    git(work, "add", "-A")
    git(work, "commit", "-q", "--allow-empty", "-m", "state of the repository")
    git(work, "push", "-q", "--force", str(bare), f"HEAD:refs/heads/{branch}")
    git(bare, "symbolic-ref", "HEAD", f"refs/heads/{branch}")
    sha = git(work, "rev-parse", "HEAD")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    return sha


def prune_unreachable(bare: Path) -> None:
    """What a forge's garbage collection does to force-pushed-away commits: they are gone for good."""
    git(bare, "reflog", "expire", "--expire=now", "--all")
    git(bare, "gc", "-q", "--prune=now")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


DEMO_BOT = "pi-demo-bot"  # the account the stand-in's tokens belong to, owner of every fork it makes


def github_for_any_repository(root: Path, token: str, files: dict, address: str = "127.0.0.1") -> FakeForge:
    """A GitHub where every repository is a protected `main` holding `files`, cloned from a local git remote
    with `token`, and comments are accepted. The tests' workers and the `make run` demo use it (on `address`:
    another than loopback for workers in network namespaces of their own)."""
    sha = make_repository(root, "any", files)
    server = FakeForge(address)
    server.serve_git(root, basic("x-access-token", token))
    repo = r"/repos/[^/]+/[^/]+"
    server.route("GET", repo, (200, {"default_branch": "main", "clone_url": f"{server.url}/git/any.git"}))
    server.route("GET", rf"{repo}/branches/main", (200, {"name": "main", "commit": {"sha": sha}, "protected": True}))
    server.route("GET", rf"{repo}/rules/branches/main", (200, []))
    server.route("POST", rf"{repo}/issues/\d+/comments", (201, {"id": 1}))
    # Who the token is (`doctor --live` asks): a classic token with only the scope a job needs.
    server.route("GET", "/user", (200, {"login": DEMO_BOT, "id": 1, "type": "User"}, {"X-OAuth-Scopes": "repo"}))
    server.any_git_name = "any"
    # The token's account forks any repository (run.publishTo: fork, the default): `pi-demo-bot/<name>`.
    forks = re.compile(r"/repos/(?P<repo>[^/]+/[^/]+)/forks")
    server.route("POST", forks.pattern,
                 lambda request: server._fork("github", forks.fullmatch(request["path"])["repo"], DEMO_BOT))

    def forget_published():
        """Back to the repository's first state: no branch but main, no pull request (tests share one)."""
        bare = root / "any.git"
        for ref in git(bare, "for-each-ref", "--format=%(refname)", "refs/heads", "refs/pull").split():
            if ref != "refs/heads/main":
                git(bare, "update-ref", "-d", ref)
        server.pull_requests.clear()
        server.forget_forks()

    server.forget_published = forget_published
    server._github_pull_routes(r"[^/]+/[^/]+")  # pull requests of any repository
    server.any_sha = sha
    return server


# The user name each forge's client sends beside its token when it clones and pushes (apps/worker/forges/).
GIT_USERS = {"github": "x-access-token", "gitlab": "oauth2", "forgejo": "pidispatch", "azure": ""}
DEMO_GROUP = "vssgp.demo-contributors"  # the one Azure DevOps group the demo's stand-in knows


def forges_for_any_repository(root: Path, tokens: dict[str, str], files: dict, address: str = "127.0.0.1") -> FakeForge:
    """All four forges on one stand-in, for every repository or project a delivery names: GitHub as
    `github_for_any_repository`, GitLab (`/api/v4`, any numeric project), Forgejo/Gitea (`/api/v1`) and Azure DevOps
    (the organisation is the stand-in's root, Graph included). Each answers its forge's access lookup with a writer
    (GitLab Developer, Forgejo `write`, a member of the project's Contributors), serves the protected `main` holding
    `files` from one git remote that takes each forge's token (`tokens`: forge -> token) for clones and pushes,
    accepts status comments, and keeps pull/merge requests; `serve_pages` shows them. `make run` uses it."""
    server = github_for_any_repository(root, tokens["github"], files, address)
    server.serve_git(root, tuple(basic(GIT_USERS[forge], token) for forge, token in tokens.items()))
    server.pulls_on_demand = True  # every pull/merge-request sample of `send_delivery` names one
    sha, clone_url = server.any_sha, f"{server.url}/git/any.git"

    def gitlab_project(request):
        project = request["path"].rsplit("/", 1)[1]
        path = server._context("gitlab", project).get("path", f"demo/project-{project}")
        return 200, {"id": int(project), "path_with_namespace": path, "default_branch": "main",
                     "http_url_to_repo": clone_url, "web_url": f"{server.url}/{path}"}

    project = r"/api/v4/projects/\d+"
    server.route("GET", project, gitlab_project)
    server.route("GET", project + r"/repository/branches/main", (200, {
        "name": "main", "commit": {"id": sha, "short_id": sha[:8], "title": "initial"}, "merged": False,
        "protected": True, "developers_can_push": False, "developers_can_merge": False, "default": True}))
    server.route("GET", project + r"/members/all/\d+", lambda request: (200, {
        "id": int(request["path"].rsplit("/", 1)[1]), "username": "someone", "access_level": 30, "state": "active"}))
    server.route("POST", project + r"/(issues|merge_requests)/\d+/notes", (201, {"id": 302, "body": ""}))
    server._gitlab_pull_routes(r"\d+")
    # Each forge's token's account forks any repository (run.publishTo: fork, the default).
    def gitlab_fork(request):
        project_id = request["path"].split("/")[4]
        path = server._context("gitlab", project_id).get("path", f"demo/project-{project_id}")
        return server._gitlab_fork(int(project_id), path, DEMO_BOT)

    server.route("POST", project + r"/fork", gitlab_fork)

    repo = r"/api/v1/repos/[^/]+/[^/]+"
    server.route("GET", repo, lambda request: (200, {
        "id": 7, "full_name": request["path"].split("/repos/", 1)[1], "default_branch": "main", "empty": False,
        "clone_url": clone_url}))
    server.route("GET", repo + r"/branches/main", (200, {
        "name": "main", "commit": {"id": sha, "message": "initial\n"}, "protected": True, "user_can_push": True,
        "user_can_merge": True}))
    server.route("GET", repo + r"/collaborators/[^/]+/permission", (200, {"permission": "write", "role_name": "write"}))
    server.route("POST", repo + r"/issues/\d+/comments", (201, {"id": 11, "body": ""}))
    server._forgejo_pull_routes(r"[^/]+/[^/]+")
    forks = re.compile(r"/api/v1/repos/(?P<repo>[^/]+/[^/]+)/forks")
    server.route("POST", forks.pattern,
                 lambda request: server._fork("forgejo", forks.fullmatch(request["path"])["repo"], DEMO_BOT))

    repositories = r"/(?P<project>[^/_][^/]*)/_apis/git/repositories"

    def azure_repository(request):
        project, name = re.fullmatch(repositories + r"/(?P<name>[^/]+)", request["path"]).groups()
        guid = name if re.fullmatch(r"[0-9a-fA-F-]{36}", name) else str(uuid.uuid5(uuid.NAMESPACE_URL, name))
        server._pull_repository("azure", guid, project_name=project, name=name, git_name="any")
        return 200, {"id": guid, "name": name, "defaultBranch": "refs/heads/main", "remoteUrl": clone_url,
                     "project": {"id": AZURE_PROJECT_ID, "name": project}}

    server.route("GET", repositories + r"/[^/]+", azure_repository)
    server.route("GET", repositories + r"/[^/]+/refs", (200, {"count": 1, "value": [
        {"name": "refs/heads/main", "objectId": sha}]}))
    server.route("GET", r"/[^/_][^/]*/_apis/git/policy/configurations", (200, {"count": 1, "value": [
        {"id": 1, "isEnabled": True, "isBlocking": True, "isDeleted": False,
         "type": {"displayName": "Minimum number of reviewers"}, "settings": {"minimumApproverCount": 1}}]}))
    server.route("POST", r"/[^/_][^/]*/_apis/wit/workItems/\d+/comments", (200, {"id": 5, "text": ""}))
    server.route("POST", repositories + r"/[^/]+/pullRequests/\d+/threads", (200, {"id": 6}))
    server._azure_pull_routes(r"[^/_][^/]*", r"[^/]+")
    server.serve_azure_forks()
    server.route("GET", r"/_apis/graph/descriptors/[^/]+",
                 lambda request: (200, {"value": "aad." + request["path"].rsplit("/", 1)[1][:8]}))
    server.routes["/_apis/graph/groups"] = (200, {"count": 1, "value": [
        {"subjectKind": "group", "descriptor": DEMO_GROUP, "displayName": "Contributors",
         "principalName": "[demo]\\Contributors", "origin": "vsts"}]})
    server.route("GET", r"/_apis/graph/memberships/[^/]+", lambda request: (200, {"count": 1, "value": [
        {"containerDescriptor": DEMO_GROUP, "memberDescriptor": request["path"].rsplit("/", 1)[1]}]}))
    server.serve_pages()
    return server


def count_connections(forge: FakeForge) -> list:
    """From now on, the client address of every connection `forge` accepts, in order (one per TCP connection, however
    many requests it carries): how a test sees a client reuse its connections."""
    accepted = []
    process_request = forge.server.process_request

    def counted(request, client_address):
        accepted.append(client_address)
        return process_request(request, client_address)

    forge.server.process_request = counted
    return accepted


def _commit_on_main(bare: Path, branch: str, path: str, text: str) -> str:
    """`branch` of `bare` at one new commit on top of `main` that adds `path` holding `text` (no work tree)."""
    index = bare / f"index-{uuid.uuid4().hex[:8]}"
    environment = {**os.environ, **GIT_IDENTITY, "HOME": str(bare), "GIT_INDEX_FILE": str(index)}

    def run(*args: str, stdin: str | None = None) -> str:
        return subprocess.run(["git", "-C", str(bare), *args], input=stdin, capture_output=True, text=True,
                              check=True, env=environment).stdout.strip()

    try:
        run("read-tree", "main")
        blob = run("hash-object", "-w", "--stdin", stdin=text)
        run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
        commit = run("commit-tree", run("write-tree"), "-p", "main", "-m", f"Add {path}")
    finally:
        index.unlink(missing_ok=True)
    run("update-ref", f"refs/heads/{branch}", commit)
    return commit


def _tip(bare: Path, branch: str) -> str:
    """A branch's commit in a served bare repository (a stand-in id when it has none)."""
    try:
        return git(bare, "rev-parse", "--verify", "-q", f"refs/heads/{branch}^{{commit}}")
    except (subprocess.CalledProcessError, OSError):
        return hashlib.sha1(f"{bare}:{branch}".encode()).hexdigest()
