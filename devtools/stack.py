"""`make run` and `make test`: bring the services up, do the work, and leave nothing running.

    python -m devtools.stack run     # the whole platform plus one demo delivery, until Ctrl-C
    python -m devtools.stack test [--db postgres] -- [pytest args]
    python -m devtools.stack check -- [pytest args]   # the service-free tests, no service started
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from apps.worker.sandbox.mounts import unmount_under
from pidispatch_site import dev_env

from . import fake_forge, jobimage, scripted_provider, services, test_runs
from .services import ROOT, Service, SetupError, say

VAR = Path(os.environ.get("PI_VAR_DIR") or ROOT / "var").resolve()  # where settings keep it too
DEV_ENV = VAR / "dev.env"
SAMPLE_DELIVERY = ROOT / "tests" / "payloads" / "github" / "issues_labeled.json"
DEMO_SELF_ID = "1"  # the demo deployment's own (made-up) GitHub account id, for the bot-loop guard
DEMO_TIMEOUT_SECONDS = 180
DEMO_MODEL = "claude-sonnet-4-5"  # priced from pi's list, so the demo's record shows a cost
# The tokens the demo's stand-in forges take (clones, pushes, API calls), one per forge as the clients send them.
DEMO_FORGE_TOKENS = {forge: f"demo-{forge}-token" for forge in ("github", "gitlab", "forgejo", "azure")}
DEMO_AZURE_SELF_ID = "0f0f0f0f-1111-2222-3333-444444444444"  # the demo deployment's own (made-up) Azure identity
# The folders this demo's worker may run jobs in (Start a run, dispatch_run), unless PI_LOCAL_ROOTS is set: outside
# the checkout and var/, which no folder run may touch.
DEMO_LOCAL_ROOT = Path.home() / "pidispatch-folders"
DEMO_REPOSITORY = {
    "README.md": "# acme/web\n\nThe demo repository the demo job clones.\n",
    ".pi/skills/demo/SKILL.md": "---\nname: demo\ndescription: The demo flow.\n---\n\nSay hello.\n",
}


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, a service manager, a closed terminal


class Stop(BaseException):
    """A stop signal arrived (a BaseException, like KeyboardInterrupt: no `except Exception` swallows it)."""


class StopSignals:
    """The first stop signal stops everything, once; every later one is ignored, so that a second Ctrl-C or a
    service manager's repeated SIGTERM cannot cut the cleanup short and leave a private engine or Redis behind."""

    def __init__(self):
        self.received: str | None = None

    def install(self) -> None:
        for number in STOP_SIGNALS:
            signal.signal(number, self._handle)

    def _handle(self, signum, frame):
        if self.received:
            return
        self.received = signal.Signals(signum).name
        raise Stop(self.received)


def _ignore_signal(signum, frame):
    pass  # not SIG_IGN: a disposition children would inherit


class Stack:
    """The services one command started, stopped in reverse order whatever happens."""

    def __init__(self):
        self.services: list[Service] = []
        self.docker_host: str | None = None
        self.pumps: list[threading.Thread] = []
        self.before_stop = []  # called first when it stops (make run takes its addresses out of var/dev.env)
        self._stopping = False

    def add(self, service: Service | None) -> None:
        if service is not None:
            self.services.append(service)

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for number in STOP_SIGNALS:  # stopping already: a signal now must not cut the cleanup short
            signal.signal(number, _ignore_signal)
        for function in self.before_stop:
            _quietly(function)
        # Every stop is bounded, and one that fails does not keep the others from stopping.
        for service in reversed(self.services):
            if service.name == "dockerd" and (service.env.get("DOCKER_HOST") or self.docker_host):
                _quietly(services.remove_job_containers, service.env.get("DOCKER_HOST") or self.docker_host)
            # A closed terminal (SIGHUP) makes printing fail: that must not stop the cleanup either.
            _quietly(say, f"stopping {service.name}")
            try:
                service.stop()
            except Exception as error:
                _quietly(say, f"could not stop {service.name} ({type(error).__name__}: {error})")
        _quietly(services.stop_stray_children)
        # The children's output ends with them; printing it from a thread past interpreter exit would crash.
        for pump in self.pumps:
            pump.join(timeout=2)


def _quietly(function, *args):
    try:
        return function(*args)
    except Exception:  # cleanup must not mask the reason we are stopping
        return None


def _dev_secrets() -> dict[str, str]:
    """Secrets the demo needs, generated once and kept in var/dev.env (the environment wins over it). Service
    addresses a `make run` that is gone left there are dropped now, before anything can read them."""
    values = dev_env.read(DEV_ENV).kept
    values.setdefault("GITHUB_WEBHOOK_SECRET", secrets.token_hex(20))
    values.setdefault("GITHUB_SELF_ID", DEMO_SELF_ID)
    dev_env.write(DEV_ENV, values)
    return {key: os.environ.get(key, value) for key, value in values.items()}


# What `make run` tells the commands run beside it (var/dev.env), when it set them rather than the environment:
# where its services listen, and the demo's stand-ins for the provider and GitHub with their made-up keys.
SERVICE_VARIABLES = ("REDIS_URL", "DOCKER_HOST", "PI_JOB_IMAGE", "PI_PROVIDER", "PI_PROVIDER_BASE_URL",
                     "ANTHROPIC_API_KEY", "PI_MODEL", "PI_PUBLIC_URL", "GITHUB_API_URL", "GITHUB_TOKEN",
                     "GITLAB_URL", "GITLAB_TOKEN", "GITLAB_WEBHOOK_MODE", "GITLAB_WEBHOOK_SECRET", "GITLAB_SELF_ID",
                     "FORGEJO_URL", "FORGEJO_TOKEN", "FORGEJO_WEBHOOK_SECRET", "FORGEJO_SELF_ID",
                     "AZURE_ORG_URL", "AZURE_TOKEN", "AZURE_WEBHOOK_MODE", "AZURE_WEBHOOK_SECRET", "AZURE_SELF_ID")


def _publish_services(env: dict) -> None:
    services_now = {key: env[key] for key in SERVICE_VARIABLES if env.get(key) and env[key] != os.environ.get(key)}
    dev_env.write(DEV_ENV, dev_env.read(DEV_ENV).kept, services_now, os.getpid())


def _withdraw_services() -> None:
    """Only this run's addresses: a file another `make run` rewrote since is its own."""
    found = dev_env.read(DEV_ENV)
    if found.stack_pid == os.getpid():
        dev_env.write(DEV_ENV, found.kept)


_last_child_line = [time.monotonic()]  # when a child last printed (the summary waits for a pause)


def _wait_for_quiet(pause: float = 1.5, most: float = 10.0) -> None:
    """Until the children have said nothing for `pause` seconds (at most `most`): what a finished job sets off (the
    worker's daily housekeeping, say) prints before the summary, which stays the last thing on the screen."""
    deadline = time.monotonic() + most
    while time.monotonic() - _last_child_line[0] < pause and time.monotonic() < deadline:
        time.sleep(0.1)


def _prefix_output(process: subprocess.Popen, prefix: str, stack: Stack) -> None:
    def pump():
        shown = True
        for line in process.stdout:  # read to the end whatever happens, or the child blocks on a full pipe
            _last_child_line[0] = time.monotonic()
            if shown:
                try:
                    sys.stdout.write(f"{prefix} {line.decode(errors='replace')}")
                    sys.stdout.flush()
                except (OSError, ValueError):  # the terminal is gone (SIGHUP)
                    shown = False

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    stack.pumps.append(thread)


def _start_child(stack: Stack, name: str, command: list[str], env: dict, stop_signal=signal.SIGTERM) -> None:
    process = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    stack.add(Service(name, process, stop_signal=stop_signal, stop_timeout=40))
    _prefix_output(process, f"[{name}]", stack)


def _manage(env: dict, *args: str) -> None:
    # Its own session: a Ctrl-C reaches only make run, which stops it (no traceback from the child).
    result = subprocess.run([sys.executable, "manage.py", *args], env=env, cwd=ROOT, start_new_session=True)
    if result.returncode != 0:
        raise SetupError(f"`python manage.py {' '.join(args)}` failed (exit {result.returncode}); see above.")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _demo_forge_settings(url: str) -> dict[str, str]:
    """The deployment's settings for the other three forges on the demo's stand-in: their API roots, tokens, webhook
    secrets (new each run; `manage.py send_delivery` beside it reads them through var/dev.env) and own ids. Published
    as services, so nothing of a forge that is gone stays configured once make run stops."""
    return {
        "GITLAB_URL": url, "GITLAB_TOKEN": DEMO_FORGE_TOKENS["gitlab"], "GITLAB_WEBHOOK_MODE": "token",
        "GITLAB_WEBHOOK_SECRET": secrets.token_hex(20), "GITLAB_SELF_ID": DEMO_SELF_ID,
        "FORGEJO_URL": url, "FORGEJO_TOKEN": DEMO_FORGE_TOKENS["forgejo"],
        "FORGEJO_WEBHOOK_SECRET": secrets.token_hex(20), "FORGEJO_SELF_ID": DEMO_SELF_ID,
        "AZURE_ORG_URL": url, "AZURE_TOKEN": DEMO_FORGE_TOKENS["azure"], "AZURE_WEBHOOK_MODE": "basic",
        "AZURE_WEBHOOK_SECRET": f"pidispatch:{secrets.token_hex(20)}", "AZURE_SELF_ID": DEMO_AZURE_SELF_ID,
        "AZURE_FORK_PROJECT": fake_forge.AZURE_FORK_PROJECT,
    }


def _demo_payload() -> dict:
    payload = json.loads(SAMPLE_DELIVERY.read_bytes())
    # A new issue number each run: the same issue labelled again within 10 minutes is (rightly) a duplicate.
    payload["issue"]["number"] = secrets.randbelow(90000) + 10000
    return payload


def _send_sample_delivery(base_url: str, secret: str, payload: dict) -> tuple[int, dict, str]:
    body = json.dumps(payload).encode()
    delivery_id = f"demo-{uuid.uuid4()}"
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(
        f"{base_url}/hooks/github", data=body, method="POST",
        headers={"Content-Type": "application/json", "X-GitHub-Event": "issues",
                 "X-GitHub-Delivery": delivery_id, "X-Hub-Signature-256": signature},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), delivery_id
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}"), delivery_id


def _setup_django(env: dict) -> None:
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pidispatch_site.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _python() -> str:
    """How the person running make run starts this checkout's Python, for the commands it suggests."""
    executable = Path(sys.executable)
    return str(executable.relative_to(ROOT)) if executable.is_relative_to(ROOT) else "python"


def _ensure_admin() -> str:
    """The admin user, created on the first run. Returns how to log in, for the summary at the end (where
    it is seen, not scrolled away among the setup lines)."""
    from django.contrib.auth import get_user_model

    User = get_user_model()
    username = os.environ.get("PI_ADMIN_USER", "admin")
    reset = f"reset it with `{_python()} manage.py changepassword {username}`"
    if User.objects.filter(username=username).exists():
        say(f"admin user '{username}' exists")
        return f"user '{username}', the password it was given when it was created ({reset})"
    password = os.environ.get("PI_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    User.objects.create_superuser(username=username, email="", password=password)
    say(f"created admin user '{username}'")
    if os.environ.get("PI_ADMIN_PASSWORD"):
        return f"user '{username}', the password from PI_ADMIN_PASSWORD ({reset})"
    return f"user '{username}', password {password}  (shown this once; {reset})"


def _seed_demo_triggers(forges: tuple[str, ...]) -> None:
    """One demo trigger per forge the demo serves: its issues (Azure DevOps: work items, on its repository `web`)
    labelled `pi` run the `demo` flow."""
    from apps.receiver.models import Trigger

    for forge in forges:
        if not Trigger.objects.filter(kind=forge, on_type="label").exists():
            Trigger.objects.create(position=Trigger.objects.count(), kind=forge, on_type="label",
                                   label_any=["pi"], flow="demo", repository="web" if forge == "azure" else "",
                                   note=f"demo: {forge} issues labelled `pi` run the `demo` flow")
            say(f"seeded a demo trigger: {forge} {'work items' if forge == 'azure' else 'issues'} labelled `pi` run "
                "the `demo` flow")


def _wait_for_run(job_id: str, timeout: float):
    from apps.worker.models import Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.filter(job_id=job_id).order_by("-attempt").first()
        if run is not None:
            return run
        time.sleep(0.5)
    return None


def _demo_provider(env: dict, stack: Stack) -> str:
    """The demo's model: the real provider through the gateway when its key is set, else a local scripted one
    (devtools/scripted_provider.py) behind the same gateway, standing in for Anthropic. Says which."""
    provider = env.setdefault("PI_PROVIDER", "anthropic")
    registry = json.loads((ROOT / "apps" / "worker" / "sandbox" / "pi_registry.json").read_text())["providers"]
    variable = registry.get(provider, {}).get("keyVariable")
    if env.get("PI_JOB_IMAGE") == services.DEMO_IMAGE:
        env.setdefault(variable or "ANTHROPIC_API_KEY", "demo-key-the-fake-runner-never-uses")
        return "the fake runner of the demo image, no model"
    if (variable and env.get(variable)) or env.get("PI_PROVIDER_BASE_URL"):
        say(f"the demo job talks to the real {provider} provider through its egress gateway "
            f"({variable or 'PI_PROVIDER_KEY_VARS'} is set; it never enters the container)")
        return f"real {provider}"
    key = secrets.token_hex(16)
    model = scripted_provider.ScriptedProvider(key=key)
    stack.add(Service("scripted model", stop_function=model.close))
    env.update(PI_PROVIDER="anthropic", PI_PROVIDER_BASE_URL=model.url, ANTHROPIC_API_KEY=key,
               PI_MODEL=env.get("PI_MODEL") or DEMO_MODEL)
    say(f"no provider key is set: the demo's model is a local scripted stand-in for Anthropic at {model.url} "
        "(set ANTHROPIC_API_KEY to use the real one); the real pi calls it through its gateway")
    return f"scripted model standing in for anthropic/{env['PI_MODEL']}"


RUN_LOCK = VAR / "make-run.lock"


def hold_the_checkout():
    """The checkout's one `make run`, taken before anything starts (the image build included): a second one would
    start a second Redis and Docker engine on the same data folders, and take the first's addresses. An flock, so
    it is let go however this process ends; the file says whose it is. The open file is returned: keep it."""
    held = open(RUN_LOCK, "a+")  # noqa: SIM115 (held for the process's lifetime)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        running = held.read().strip() or "?"
        held.close()
        raise SetupError(f"make run is running in this checkout already (pid {running}); its services are in "
                         f"{DEV_ENV} once it has started them. Use them, or stop it first (Ctrl-C in its terminal, "
                         f"or kill -TERM {running}).") from None
    held.truncate(0)
    held.write(str(os.getpid()))
    held.flush()
    return held


def run_platform(args) -> int:
    stack = Stack()
    stop_signals = StopSignals()
    try:
        stop_signals.install()
        VAR.mkdir(mode=0o700, parents=True, exist_ok=True)
        checkout_lock = hold_the_checkout()  # noqa: F841 (held until this process exits)
        env = {**os.environ, **_dev_secrets()}
        stack.before_stop.append(_withdraw_services)
        services.ensure_package("git", "git")  # jobs clone their repository; the demo forge serves one

        redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        if os.environ.get("REDIS_SENTINELS"):  # behind Sentinel: its primary or nothing, never a Redis of our own
            say("using " + services.sentinel_primary(os.environ["REDIS_SENTINELS"],
                                                     os.environ.get("REDIS_SENTINEL_MASTER", "")))
        elif services.redis_answers(redis_url):
            say(f"using the Redis at {redis_url}")
        else:
            port = services.free_port(6390)
            say(f"no Redis at {redis_url}; starting a private redis-server on 127.0.0.1:{port} (data in var/redis)")
            redis_service = services.start_redis(VAR / "redis", port, persistent=True, started=stack.add)
            redis_url = redis_service.env["REDIS_URL"]
        env["REDIS_URL"] = redis_url

        docker_host = os.environ.get("DOCKER_HOST")
        if services.docker_answers(docker_host):
            say(f"using the Docker engine at {docker_host or 'the default socket'}")
        else:
            say("no reachable Docker engine; starting a private dockerd (data in var/docker)")
            docker_host, dockerd = services.start_dockerd(VAR / "docker", started=stack.add)
        stack.docker_host = docker_host
        if docker_host:
            env["DOCKER_HOST"] = docker_host
        env.setdefault("PI_JOB_IMAGE", jobimage.DEFAULT_TAG)
        if env["PI_JOB_IMAGE"] == services.DEMO_IMAGE:
            services.ensure_demo_image(docker_host, services.DEMO_IMAGE)  # the fake runner: no model at all
        elif env["PI_JOB_IMAGE"] == jobimage.DEFAULT_TAG:
            jobimage.ensure_image(docker_host, jobimage.DEFAULT_TAG)  # the real pi (about a minute, once)
        demo_model = _demo_provider(env, stack)
        # Roots live in the environment of the processes it starts only, never in var/dev.env (no file names them).
        env.setdefault("PI_LOCAL_ROOTS", str(DEMO_LOCAL_ROOT))
        say(f"folder runs: git repositories under {env['PI_LOCAL_ROOTS']} (PI_LOCAL_ROOTS declares other roots)")

        local_github = not os.environ.get("GITHUB_API_URL")
        demo_forge, demo_forges = None, ("github",)
        if local_github:
            # No forge can be reached from here: a local stand-in answers the demo jobs' API calls (access, token,
            # default branch, protection, the status comment, the pull/merge request), serves the repository they
            # clone and push to, and shows the issues and pull requests as pages.
            demo_forge = fake_forge.forges_for_any_repository(VAR / "demo-forge", DEMO_FORGE_TOKENS, DEMO_REPOSITORY)
            stack.add(Service("demo forges", stop_function=demo_forge.close))
            env.update(GITHUB_API_URL=demo_forge.url, GITHUB_TOKEN=DEMO_FORGE_TOKENS["github"])
            others = _demo_forge_settings(demo_forge.url)
            # A forge the environment configures is the operator's: the stand-in does not play it.
            demo_forges += tuple(forge for forge in ("gitlab", "forgejo", "azure")
                                 if not any(key.startswith(f"{forge.upper()}_") for key in os.environ))
            env.update({key: value for key, value in others.items()
                        if key.split("_", 1)[0].lower() in demo_forges})
            say(f"a local stand-in for {', '.join(demo_forges)} answers at {demo_forge.url} (the demo repository "
                "lives in var/demo-forge; its issues and pull requests are pages there)")
        _publish_services(env)

        say("migrating the database")
        _manage(env, "migrate", "--noinput", "-v", "0")
        _manage(env, "collectstatic", "--noinput", "-v", "0")
        port = services.free_port(int(os.environ.get("PI_PORT", "8000")))
        base_url = f"http://127.0.0.1:{port}"
        env.setdefault("PI_PUBLIC_URL", base_url)  # pull requests link their run; send_delivery posts here
        _publish_services(env)
        _setup_django(env)
        login = _ensure_admin()
        _seed_demo_triggers(demo_forges)

        # The access log goes to a file: a line per request (static files included) would bury the summary.
        access_log = VAR / "web-access.log"
        _start_child(stack, "web", [str(Path(sys.executable).parent / "gunicorn"), "pidispatch_site.wsgi",
                                    "--bind", f"127.0.0.1:{port}", "--workers", "2", "--access-logfile",
                                    str(access_log), "--no-control-socket"], env)
        # -v 0: RQ's own lines (worker started, listening, job OK, ...) stay out; pidispatch's events still show.
        _start_child(stack, "worker", [sys.executable, "manage.py", "rqworker", "pi-jobs", "-v", "0"], env,
                     stop_signal=signal.SIGINT)
        # Enqueues deliveries the inbox kept while Redis (or a forge lookup) was unavailable.
        _start_child(stack, "replayer", [sys.executable, "manage.py", "replay_deliveries", "--follow"], env)
        _start_child(stack, "cron", [sys.executable, "manage.py", "run_cron"], env)
        services.wait_until(lambda: _http_ok(f"{base_url}/healthz"), 30, "the web server")
        say(f"web server up at {base_url}/ (its access log: {access_log}); worker draining pi-jobs")

        payload = _demo_payload()
        if demo_forge is not None:  # its page shows the issue the demo labelled
            demo_forge.add_issue("github", payload["repository"]["full_name"], payload["issue"]["number"],
                                 title=payload["issue"]["title"], body=payload["issue"]["body"] or "")
        status, answer, delivery_id = _send_sample_delivery(base_url, env["GITHUB_WEBHOOK_SECRET"], payload)
        say(f"sent a signed `issues` `labeled` delivery ({delivery_id}): HTTP {status} {json.dumps(answer)}")
        if status != 202 or not answer.get("jobs"):
            raise SetupError("the demo delivery did not become a job; see the [web] lines above.")
        job_id = answer["jobs"][0]
        run = _wait_for_run(job_id, DEMO_TIMEOUT_SECONDS)
        if run is None:
            raise SetupError(f"no run record for {job_id} after {DEMO_TIMEOUT_SECONDS} s; see the [worker] lines "
                             "above (is the worker running, can it reach Docker?).")
        _wait_for_quiet()
        url = f"{base_url}/admin/worker/run/{run.pk}/change/"
        detail = f" ({run.reason})" if run.reason else ""
        spend = (f"{run.tokens_total} tokens" if run.tokens_total is not None else "no tokens metered") + (
            f", ${run.cost}" if run.cost is not None else "")
        print(f"\ndemo run {job_id} {run.outcome}{detail} ({demo_model}; {spend}): {url}", flush=True)
        if run.publish_outcome:
            where = f" #{run.pull_request}" if run.pull_request else ""
            page = (f": {demo_forge.url}/{payload['repository']['full_name']}/pull/{run.pull_request}"
                    if demo_forge is not None and run.pull_request else "")
            print(f"published by the worker: {run.publish_outcome}{where}"
                  + (f" on the local stand-in GitHub (var/demo-forge){page}" if local_github else ""), flush=True)
        print("", flush=True)
        say("commands beside it, in another shell, find its services through var/dev.env: "
            f"`{_python()} manage.py fleet status`, `{_python()} manage.py doctor`")
        if len(demo_forges) > 1:
            say(f"try a trigger of any forge: `{_python()} manage.py send_delivery --forge gitlab --label pi` "
                f"({', '.join(demo_forges)}; other events: --help)")
        say("everything keeps running; press Ctrl-C (or send SIGTERM) to stop it all")
        say(f"admin: {base_url}/admin/  {login}")  # last, where it is seen

        while True:
            for service in stack.services:
                if service.process is not None and service.process.poll() is not None:
                    raise SetupError(f"{service.name} exited with code {service.process.returncode}; stopping.")
            time.sleep(1)
    except Stop as stop:
        _quietly(print)  # off the line a Ctrl-C left its ^C on; the terminal may be gone (SIGHUP)
        _quietly(say, f"{stop} received: stopping what make run started (further signals are ignored until it is "
                      "done)")
        return 0
    finally:
        stack.stop()
        # The jobs' workspace volumes (apps/worker/sandbox/workspace_volume.py) of the folders the demo keeps: the
        # host keeps no mount of a stack that stopped (their files stay, under var/jobs).
        _quietly(unmount_under, Path(os.environ.get("PI_JOB_ROOT") or VAR / "jobs"))
        _detach_if_gone()


def _detach_if_gone() -> None:
    """When the terminal went away (SIGHUP), what is left to print goes nowhere, so that the exit stays 0
    instead of Python's 120 for output it could not flush."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


def test_processes(pytest_args: list[str]) -> int:
    """How many pytest processes share the run (pytest-xdist), each with services of its own: one per core, two
    at least and four at most. The suite mostly waits (on containers, workers, servers): on a quiet two-core
    machine the whole suite took 20.7 min of pytest with two processes and 18.8 with three, but only two have run
    it clean every time, so two it is. A run of named files or tests stays one process: starting more engines
    costs more than it saves. PI_TEST_PROCESSES=1 (or another number) overrides it."""
    wanted = os.environ.get("PI_TEST_PROCESSES", "auto")
    if wanted != "auto":
        return max(1, int(wanted))
    if "-n" in pytest_args or any(arg.startswith(("-n", "--numprocesses")) for arg in pytest_args):
        return 1  # the caller drives xdist
    paths = [arg for arg in pytest_args if not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists()]
    if paths and all("::" in arg or (ROOT / arg).is_file() for arg in paths):
        return 1
    return min(4, max(2, os.cpu_count() or 1))


def start_test_services(stack: Stack, index: int, folders: Path) -> dict[str, str]:
    """One private redis-server, Docker engine (holding both job images), local-folder and skills-folder roots:
    what one pytest process's tests may flush, reap and fill without touching another's."""
    suffix = f"-{index}" if index else ""
    redis_dir, local_root = folders / f"redis{suffix}", folders / f"local-folders{suffix}"
    skills_root = folders / f"skills-folders{suffix}"
    redis_dir.mkdir()
    for root in (local_root, skills_root):
        root.mkdir()
        root.chmod(0o755)  # the test repositories' owner (a uid of its own) passes through it
    port = services.free_port()
    say(f"starting a private redis-server for the tests on 127.0.0.1:{port}")
    redis_service = services.start_redis(redis_dir, port, persistent=False, started=stack.add)
    say(f"starting a private Docker engine for the tests (data in var/test-docker{suffix})")
    docker_host, _ = services.start_dockerd(VAR / f"test-docker{suffix}", started=stack.add)
    services.ensure_demo_image(docker_host, services.DEMO_IMAGE)
    # The production image, for the tests where the real pi matters (built once, cached by its inputs).
    real_image = jobimage.ensure_image(docker_host, jobimage.DEFAULT_TAG)
    return {"REDIS_URL": redis_service.env["REDIS_URL"], "DOCKER_HOST": docker_host,
            "PI_REAL_JOB_IMAGE": real_image, "PI_LOCAL_ROOTS": str(local_root), "PI_SKILLS_ROOTS": str(skills_root)}


PYTEST_STOP_SECONDS = 12  # after a stop signal, pytest's own teardown (its fixtures stop what the tests started)


def run_tests(args) -> int:
    """The suite against private services. A stop signal (Ctrl-C, SIGTERM, SIGHUP) interrupts pytest, lets its
    teardown run for a few seconds, then stops whatever carries this run's mark and the services: nothing of the run
    is left within 30 s. A run killed outright leaves its folder and processes, which the next run clears first."""
    test_runs.clear_killed_runs(say)
    stack = Stack()
    stop_signals = StopSignals()
    run = test_runs.TestRun()
    pytest_process: subprocess.Popen | None = None
    processes = test_processes(args.pytest_args)
    try:
        stop_signals.install()
        database = {}
        if args.db == "postgres":
            port = services.free_port()
            say(f"starting a private PostgreSQL for the tests on 127.0.0.1:{port}")
            database = services.start_postgres(run.folder / "postgres", port, started=stack.add).env
        each = [start_test_services(stack, index, run.folder) for index in range(processes)]
        stack.docker_host = each[0]["DOCKER_HOST"]
        services.ensure_package("git", "git")
        services.ensure_package("node", "nodejs")  # the image runner's tests run it on the host
        services.ensure_package("chromium", "chromium")  # the fleet panel's browser test

        env = {
            **os.environ,
            **database,
            **each[0],
            "PI_JOB_IMAGE": services.DEMO_IMAGE,
            # devtools/test_processes.py gives each pytest-xdist process its own set of these.
            "PIDISPATCH_TEST_SERVICES": json.dumps(each),
            # No connection may outlive a test's thread (live servers), or the test database cannot be dropped.
            "DATABASE_CONN_MAX_AGE": "0",
            "PIDISPATCH_TEST_STACK": "1",
        }
        parallel = ["-n", str(processes), "--dist", "loadfile"] if processes > 1 else []
        if args.db == "postgres" and not _selects_marks(args.pytest_args):
            parallel += ["-m", "database"]  # what PostgreSQL answers differently, and the fleet drills
        # Every test's tmp_path inside the run's folder: what a test starts there is the run's (test_runs.py).
        command = [sys.executable, "-m", "pytest", "-p", "devtools.test_processes", f"--basetemp={run.folder / 't'}",
                   *parallel, *args.pytest_args]
        say(" ".join(command[1:]))
        # Its own session: a stop signal reaches it from here, once, as an interrupt its teardown answers.
        pytest_process = subprocess.Popen(command, env=env, cwd=ROOT, start_new_session=True)
        code = pytest_process.wait()
        if code == 5:
            say("pytest collected no tests: that is a failure, not a pass")
            return 1
        return code
    except Stop as stop:
        _quietly(say, f"{stop} received: stopping the tests and what they started")
        return 128 + getattr(signal, stop.args[0]).value
    finally:
        for number in STOP_SIGNALS:  # stopping now (a signal during the cleanup must not cut it short)
            signal.signal(number, _ignore_signal)
        _stop_pytest(pytest_process)
        services_groups = {service.process.pid for service in stack.services if service.process is not None}
        test_runs.stop_processes(run.processes(except_groups=services_groups), grace=5)  # what the tests started
        stack.stop()
        test_runs.stop_processes(run.processes(), grace=5)  # and whatever the services left (a containerd)
        run.remove_folder()


def _selects_marks(pytest_args: list[str]) -> bool:
    return any(arg == "-m" or arg.startswith("-m") and not arg.startswith("--") for arg in pytest_args)


def _stop_pytest(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)  # pytest and its xdist processes: KeyboardInterrupt, then teardown
    try:
        process.wait(PYTEST_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


# Where the service-free tests would find services, if one of them reached for one: nothing listens there, so such a
# test fails at once, saying what it reached for (and belongs out of SERVICE_FREE in tests/conftest.py).
NO_SERVICES = {"REDIS_URL": "redis://127.0.0.1:1/0", "DOCKER_HOST": "unix:///nonexistent/docker.sock",
               "PIDISPATCH_TEST_STACK": "1", "PIDISPATCH_SERVICE_FREE": "1"}


def run_check(args) -> int:
    """`make check`: the tests that need no service (marker `service_free`), with no Redis, engine or browser
    started: a loop of a minute or two for the code most changes touch."""
    command = [sys.executable, "-m", "pytest", "-m", "service_free", "-q", *args.pytest_args]
    say(" ".join(command[1:]))
    code = subprocess.run(command, env={**os.environ, **NO_SERVICES}, cwd=ROOT).returncode
    if code == 5:
        say("pytest collected no tests: that is a failure, not a pass")
        return 1
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.stack")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="run the platform and one demo delivery until Ctrl-C")
    test = commands.add_parser("test", help="run the test suite against a private Redis and Docker engine")
    test.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite",
                      help="postgres: a private PostgreSQL, and (unless -m is given) only the tests marked "
                           "`database`: those it answers differently, and the fleet drills")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    check = commands.add_parser("check", help="run the tests that need no service, starting none")
    check.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command in ("test", "check") and args.pytest_args[:1] == ["--"]:
        args.pytest_args = args.pytest_args[1:]
    return {"run": run_platform, "test": run_tests, "check": run_check}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
