"""A stand-in for the forges: a small local HTTP server answering their API calls (JSON per path) and serving
bare git repositories over HTTP through `git http-backend`, plus helpers to make those repositories.

The forges' SaaS cannot be reached from these machines, so the tests (tests/receiver_support.py) and the
`make run` demo use this instead. Response shapes follow each forge's documented answers.
"""

from __future__ import annotations

import base64
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
    `root/<name>.git`, served by `git http-backend` to requests carrying exactly that Authorization header."""

    def __init__(self):
        self.routes: dict = {}
        self.patterns: list = []  # (method, compiled path regex, route), tried after `routes`
        self.fallback = None  # answers paths without a route (default: 404)
        self.requests: list[dict] = []
        self.git_root: Path | None = None
        self.git_authorization: str | None = None
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
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _git(self, parts, raw: bytes):
                if self.headers.get("Authorization") != forge.git_authorization:
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False  # a deliberately slow answer must not hold up the test's teardown
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
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

    def serve_git(self, root: Path, authorization: str) -> None:
        self.git_root, self.git_authorization = Path(root), authorization

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

    def github_app(self, app_id: str, installation_id: str, public_key, account: str, token: str = "ghs_jobtoken"):
        """The installation-token exchange, checking the App's RS256 JWT as GitHub does; each minted token is
        `<token>-<n>` and is listed in `self.minted` with the repositories it was scoped to."""
        import jwt

        self.minted: list[dict] = []

        def exchange(request):
            scheme, _, presented = request["headers"].get("authorization", "").partition(" ")
            try:
                claims = jwt.decode(presented, public_key, algorithms=["RS256"],
                                    options={"require": ["iat", "exp", "iss"]})
            except jwt.PyJWTError as error:
                return 401, {"message": f"A JSON web token could not be decoded ({type(error).__name__})"}
            if scheme != "Bearer" or str(claims["iss"]) != app_id or claims["exp"] - claims["iat"] > 600:
                return 401, {"message": "'Issuer' claim ('iss') must be an Integer"}
            names = (request["body"] or {}).get("repositories") or []
            minted = {"token": f"{token}-{len(self.minted) + 1}", "repositories": [f"{account}/{n}" for n in names],
                      "permissions": (request["body"] or {}).get("permissions")}
            self.minted.append(minted)
            return 201, {"token": minted["token"], "expires_at": "2099-01-01T00:00:00Z",
                         "permissions": minted["permissions"] or {"contents": "write", "issues": "write"},
                         "repository_selection": "selected",
                         "repositories": [{"id": 1, "full_name": name} for name in minted["repositories"]]}

        self.routes[("POST", f"/app/installations/{installation_id}/access_tokens")] = exchange
        self.routes[("DELETE", "/installation/token")] = (204, None)
        self.routes["/app"] = (200, {"id": int(app_id), "slug": "pi-dispatch-test", "name": "pi dispatch test"})

    def gitlab_project(self, project_id: int, path: str, sha: str, *, branch: str = "main", protected: bool = True):
        self.routes[f"/api/v4/projects/{project_id}"] = (200, {
            "id": project_id, "path_with_namespace": path, "default_branch": branch,
            "http_url_to_repo": f"{self.url}/git/{path}.git", "ssh_url_to_repo": f"git@example.com:{path}.git"})
        self.routes[f"/api/v4/projects/{project_id}/repository/branches/{branch}"] = (200, {
            "name": branch, "commit": {"id": sha, "short_id": sha[:8], "title": "initial"}, "merged": False,
            "protected": protected, "developers_can_push": False, "developers_can_merge": False, "default": True})
        self.route("POST", rf"/api/v4/projects/{project_id}/(issues|merge_requests)/\d+/notes",
                   (201, {"id": 302, "body": "", "author": {"id": 900001}}))

    def forgejo_repository(self, repo: str, sha: str, *, branch: str = "main", protected: bool = True):
        self.routes[f"/api/v1/repos/{repo}"] = (200, {
            "id": 7, "full_name": repo, "default_branch": branch, "empty": False,
            "clone_url": f"{self.url}/git/{repo}.git"})
        self.routes[f"/api/v1/repos/{repo}/branches/{branch}"] = (200, {
            "name": branch, "commit": {"id": sha, "message": "initial\n"}, "protected": protected,
            "user_can_push": True, "user_can_merge": True})
        self.route("POST", rf"/api/v1/repos/{re.escape(repo)}/issues/\d+/comments", (201, {"id": 11, "body": ""}))

    def azure_repository(self, project_id: str, repository_id: str, name: str, sha: str, *,
                         blocking_policy: bool = True):
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


def github_for_any_repository(root: Path, token: str, files: dict) -> FakeForge:
    """A GitHub where every repository is a protected `main` holding `files`, cloned from a local git remote
    with `token`, and comments are accepted. The tests' workers and the `make run` demo use it."""
    sha = make_repository(root, "any", files)
    server = FakeForge()
    server.serve_git(root, basic("x-access-token", token))
    repo = r"/repos/[^/]+/[^/]+"
    server.route("GET", repo, (200, {"default_branch": "main", "clone_url": f"{server.url}/git/any.git"}))
    server.route("GET", rf"{repo}/branches/main", (200, {"name": "main", "commit": {"sha": sha}, "protected": True}))
    server.route("GET", rf"{repo}/rules/branches/main", (200, []))
    server.route("POST", rf"{repo}/issues/\d+/comments", (201, {"id": 1}))
    return server
