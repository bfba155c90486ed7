"""How much the worker adds to a job, measured side by side in one run.

    .venv/bin/python bench/worker.py [--jobs 20]
    .venv/bin/python bench/worker.py --gateway-only [--calls 200]

Starts a private Redis and Docker engine (as `make test` does), a temporary SQLite database and one real
`manage.py rqworker pi-jobs`, then times, one job at a time:

  docker-cli   `docker run --rm` of the demo image with the worker's isolation flags (the baseline)
  bare-rq      enqueue -> finished of an RQ job that does nothing (RQ's own floor)
  local job    enqueue -> run record of a pidispatch job on a local git folder: every gate, the container,
               the record (the ladder alone)
  forge job    the same for a GitHub job, which also clones its repository from a local stand-in GitHub

  real pi     enqueue -> run record of a GitHub job on the production image (make image), the real pi CLI
              doing three model calls and two tool calls against a local scripted provider through its
              egress gateway, beside `docker run` of the same image with the same flags, mounts and a gateway
  gateway     one provider call through the gateway's socket against the same call made to the provider
              directly (the latency the gateway adds per call)

and prints medians, the enqueue-to-container-start latency, the gates' own share (as the worker logs it),
everything the worker adds beyond the container's own API life, and the ratios. A forge job's workspace
(token, default branch, protection, the clone) is shown apart: it is the job's own work, which the docker
CLI baseline does not do. Targets: the gates add under 20 ms median beyond the container itself; a job
stays within 1.2x the docker CLI; the gateway adds under 2 ms median per provider call. Measure on a quiet
machine: the engine's own times swing with load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

LOCAL_OWNER = (1234, 1234)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools import fake_forge, jobimage, scripted_provider, services  # noqa: E402

REAL_MODEL = "claude-sonnet-4-5"
REAL_SCENARIO = [  # what the real pi does in each round: three model calls, a write and a shell command
    scripted_provider.ToolCall("write", {"path": "NOTES.md", "content": "bench\n"}),
    scripted_provider.ToolCall("bash", {"command": "git status --short"}),
    scripted_provider.Text("Done."),
]


def median_ms(values):
    return statistics.median(values) * 1000


def docker_cli_command(docker_host: str, workdir: Path) -> tuple[list[str], dict]:
    """`docker run` with the worker's isolation flags, on the same image and mounts."""
    job_dir, workspace = workdir / "cli-job", workdir / "cli-ws"
    job_dir.mkdir()
    workspace.mkdir()
    (job_dir / "prompt.md").write_text("benchmark\n")
    os.chown(workspace, 1000, 1000)
    command = ["docker", "run", "--rm", "--init", "--cap-drop=ALL", "--security-opt", "no-new-privileges",
               "--pids-limit=512", "--memory=1g", "--cpus=2", "--shm-size=1g", "--network=none",
               "--user=1000:1000", "-v", f"{job_dir}:/job:ro", "-v", f"{workspace}:/workspace",
               "-e", "PI_JOB_ID=bench", "-e", "PI_FLOW=bench", services.DEMO_IMAGE]
    return command, {**os.environ, "DOCKER_HOST": docker_host}


def read_phases(stream, sink: dict, published: dict):
    """The worker logs `job_phases job=<id> gates_ms=<n> workspace_ms=<n> container_ms=<n>` per container, and
    `publish job=<id> outcome=<o> ... publish_ms=<n>` per published forge run (the push and the PR call)."""
    for line in stream:
        if "job_phases" in line or "pidispatch.publish publish " in line:
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "job_phases" in line:
            sink[fields["job"]] = (float(fields["gates_ms"]) / 1000, float(fields["container_ms"]) / 1000,
                                   float(fields.get("workspace_ms", 0)) / 1000)
        elif "pidispatch.publish publish " in line:
            published[fields["job"]] = (fields["outcome"], float(fields["publish_ms"]) / 1000)


def local_repository(folder: Path) -> Path:
    """A git folder for the local job, owned by an ordinary user (a root-owned folder is refused)."""
    folder.mkdir()
    for command in (["init", "-q", "-b", "main"], ["add", "."],
                    ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "commit", "-q", "-m", "init"]):
        if command[0] == "add":
            (folder / "README.md").write_text("bench\n")
        subprocess.run(["git", "-C", str(folder), *command], check=True)
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, *LOCAL_OWNER)
    return folder


@dataclass
class Measures:
    full: list = field(default_factory=list)  # enqueue -> run record
    to_start: list = field(default_factory=list)  # enqueue -> container start
    gates: list = field(default_factory=list)  # the worker's gates (without a forge workspace)
    workspace: list = field(default_factory=list)  # a forge job's workspace
    added: list = field(default_factory=list)  # everything beyond the container's own API life


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def container_events(docker_host: str, sink: dict):
    import docker

    client = docker.DockerClient(base_url=docker_host)
    for event in client.events(decode=True, filters={"label": "pidispatch.job", "type": "container"}):
        if event.get("status") in ("start", "die"):
            sink.setdefault(event["Actor"]["Attributes"]["pidispatch.job"], {})[event["status"]] = (
                event["timeNano"] / 1e9)


def real_cli_run(docker_host: str, scratch: Path, image: str, model, index: int) -> float:
    """`docker run` of the real image with the worker's flags, its /job files and a gateway of its own, timed
    from the command to its exit (what the CLI baseline of a real job costs, the model's calls included)."""
    from apps.fleet.connection import get_redis
    from apps.worker.sandbox import agent_config, gateway
    from apps.worker.sandbox.providers import Upstream

    job_dir, workspace = scratch / f"real-cli-job-{index}", scratch / f"real-cli-ws-{index}"
    job_dir.mkdir()
    workspace.mkdir()
    (job_dir / "prompt.md").write_text("benchmark\n")
    os.chown(workspace, 1000, 1000)
    upstream = Upstream("anthropic", "anthropic-messages", model.url, builtin=True)
    agent_config.write(job_dir, upstream, REAL_MODEL)
    egress = gateway.EgressGateway(job_id=f"cli-{index}", upstream=upstream, key="bench-key", allow=frozenset(),
                                   limits=gateway.Limits(), redis=get_redis(), owner=(1000, 1000),
                                   on_stop=lambda reason: None)
    egress.start()
    try:
        command = ["docker", "run", "--rm", "--init", "--cap-drop=ALL", "--security-opt", "no-new-privileges",
                   "--pids-limit=512", "--memory=1g", "--cpus=2", "--shm-size=1g", "--network=none",
                   "--user=1000:1000", "-v", f"{job_dir}:/job:ro", "-v", f"{workspace}:/workspace",
                   "-e", "PI_JOB_ID=bench", "-e", "PI_FLOW=bench", "-e", "PI_PROVIDER=anthropic",
                   "-e", f"PI_MODEL={REAL_MODEL}", "-e", "PI_MAX_TURNS=30", "-e", "HOME=/home/pi"]
        for name, value in egress.container_environment().items():
            command += ["-e", f"{name}={value}"]
        for source, target in egress.mounts():
            command += ["-v", f"{source}:{target}:ro"]
        return timed(lambda: subprocess.run([*command, image], env={**os.environ, "DOCKER_HOST": docker_host},
                                            check=True, capture_output=True))
    finally:
        egress.close()


# What the gateway added per call before each call's worst case was reserved (bench/worker.py, 2026-12-01).
GATEWAY_ADDED_BEFORE_MS = 1.28


def gateway_latency(model, calls: int, capped: bool = True) -> tuple[list, list]:
    """The same streamed Anthropic call, `calls` times each way, interleaved: to the provider, and through a
    gateway's provider socket (over a kept-alive connection, as pi's client keeps one). `capped`: under a token
    budget, a dollar cap and a day's token cap, so every call's worst case is reserved (the day's in Redis) and
    settled, as a job's are."""
    import http.client
    import json as json_module
    import socket
    from urllib.parse import urlsplit

    from apps.fleet.connection import get_redis
    from apps.worker.sandbox import gateway
    from apps.worker.sandbox.providers import Upstream
    from tests.egress_support import UnixHTTPConnection

    body = json_module.dumps({"model": REAL_MODEL, "max_tokens": 256, "stream": True,
                              "messages": [{"role": "user", "content": "x" * 20000}]}).encode()
    headers = {"Content-Type": "application/json", "x-api-key": "bench-key", "anthropic-version": "2023-06-01"}
    upstream = Upstream("anthropic", "anthropic-messages", model.url, builtin=True)
    limits = (gateway.Limits(max_tokens=10**12, daily_token_cap=10**12, max_cost_micros=10**12) if capped
              else gateway.Limits())
    egress = gateway.EgressGateway(job_id="bench-latency", upstream=upstream, key="bench-key", allow=frozenset(),
                                   limits=limits, redis=get_redis(), owner=(os.geteuid(), os.getegid()),
                                   on_stop=lambda reason: None)
    egress.start()
    class NoDelayConnection(http.client.HTTPConnection):
        """As pi's client (and the gateway's) sends: no Nagle wait between headers and body."""

        def connect(self):
            super().connect()
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    address = urlsplit(model.url)
    direct_connection = NoDelayConnection(address.hostname, address.port)
    gated_connection = UnixHTTPConnection(str(egress.provider_socket))
    direct, gated = [], []

    def call(connection):
        start = time.perf_counter()
        connection.request("POST", "/v1/messages", body=body, headers=headers)
        answer = connection.getresponse()
        answer.read()
        return time.perf_counter() - start

    try:
        for _ in range(calls):
            direct.append(call(direct_connection))
            gated.append(call(gated_connection))
    finally:
        egress.close()
    return direct, gated


def gateway_only(calls: int) -> int:
    """The gateway's added latency per call, with and without caps to reserve against, beside direct calls."""
    with tempfile.TemporaryDirectory(prefix="pidispatch-bench-") as scratch:
        redis_service = services.start_redis(Path(scratch) / "redis", services.free_port(), persistent=False)
        model = scripted_provider.ScriptedProvider(key="bench-key", scenarios={"bench": REAL_SCENARIO},
                                                   default="bench")
        try:
            os.environ.update({"REDIS_URL": redis_service.env["REDIS_URL"],
                               "DATABASE_URL": f"sqlite:///{Path(scratch) / 'bench.sqlite3'}",
                               "DJANGO_SETTINGS_MODULE": "pidispatch_site.settings"})
            import django

            django.setup()
            print(f"==> {calls} provider calls each way, without caps, then with every cap reserved", flush=True)
            results = [gateway_latency(model, calls, capped=False), gateway_latency(model, calls, capped=True)]
        finally:
            model.close()
            redis_service.stop()
    print(f"{'measure':52} {'median ms':>10}")
    for label, (direct, gated) in zip(("no caps", "token, dollar and day caps reserved"), results, strict=True):
        print(f"{'provider call, direct':52} {median_ms(direct):10.2f}")
        print(f"{'provider call, through the gateway (' + label + ')':52} {median_ms(gated):10.2f}")
        print(f"{'the gateway adds per call (' + label + ')':52} {median_ms(gated) - median_ms(direct):10.2f}"
              f"   target < 2 ms (before per-call reservations: {GATEWAY_ADDED_BEFORE_MS})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="time the worker's overhead against docker run and bare RQ")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--real-jobs", type=int, default=6, help="rounds with the real pi (0: skip them)")
    parser.add_argument("--calls", type=int, default=200, help="provider calls for the gateway's latency")
    parser.add_argument("--gateway-only", action="store_true", help="only the gateway's latency (Redis, no engine)")
    args = parser.parse_args()
    if args.gateway_only:
        return gateway_only(args.calls)

    stack = []
    failures = 0
    with tempfile.TemporaryDirectory(prefix="pidispatch-bench-") as scratch:
        scratch = Path(scratch)
        scratch.chmod(0o755)
        try:
            redis_service = services.start_redis(scratch / "redis", services.free_port(), persistent=False)
            stack.append(redis_service)
            docker_host, dockerd = services.start_dockerd(ROOT / "var" / "bench-docker")
            if dockerd:
                stack.append(dockerd)
            services.ensure_demo_image(docker_host)
            real_image = jobimage.ensure_image(docker_host) if args.real_jobs else ""
            model = scripted_provider.ScriptedProvider(key="bench-key", scenarios={"bench": REAL_SCENARIO},
                                                       default="bench")
            stack.append(services.Service("scripted model", stop_function=model.close))
            # Forge jobs clone their repository: a local stand-in GitHub serves one (no forge is reachable).
            forge = fake_forge.github_for_any_repository(scratch / "forge", "bench-token", {"README.md": "bench\n"})
            stack.append(services.Service("stand-in GitHub", stop_function=forge.close))
            folder = local_repository(scratch / "local")
            env = {
                **os.environ, "REDIS_URL": redis_service.env["REDIS_URL"], "DOCKER_HOST": docker_host,
                "DATABASE_URL": f"sqlite:///{scratch / 'bench.sqlite3'}", "PI_JOB_IMAGE": services.DEMO_IMAGE,
                "PI_JOB_ROOT": str(scratch / "jobs"), "PI_JOB_MEMORY": "1g", "PI_DAILY_CAP": "100000",
                "ANTHROPIC_API_KEY": "bench-key", "DJANGO_SETTINGS_MODULE": "pidispatch_site.settings",
                "PI_PROVIDER": "anthropic", "PI_PROVIDER_BASE_URL": model.url, "PI_MODEL": REAL_MODEL,
                "GITHUB_API_URL": forge.url, "GITHUB_TOKEN": "bench-token",
            }
            subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
            os.environ.update(env)
            import django

            django.setup()
            from rq import Queue

            from apps.fleet.connection import get_redis
            from apps.worker.jobs import JobSpec, enqueue
            from apps.worker.models import Run

            cli_command, cli_env = docker_cli_command(docker_host, scratch)
            worker = subprocess.Popen([sys.executable, "manage.py", "rqworker", "pi-jobs"], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)  # Service.stop signals its process group
            stack.append(services.Service("worker", worker))
            phases: dict = {}
            published: dict = {}
            threading.Thread(target=read_phases, args=(worker.stderr, phases, published), daemon=True).start()
            time.sleep(2)  # let it register
            queue = Queue("pi-jobs", connection=get_redis())
            events: dict = {}
            threading.Thread(target=container_events, args=(docker_host, events), daemon=True).start()
            time.sleep(0.5)

            def bare_job():
                job = queue.enqueue("builtins.len", "x")
                while job.get_status(refresh=True) != "finished":
                    time.sleep(0.002)

            def pidispatch_job(spec, measures: Measures) -> None:
                nonlocal failures
                enqueued_wall, start = time.time(), time.perf_counter()
                enqueue(spec, "pi-jobs")
                while not Run.objects.filter(job_id=spec.job_id).exists():
                    time.sleep(0.002)
                measures.full.append(time.perf_counter() - start)
                run = Run.objects.get(job_id=spec.job_id)
                deadline = time.time() + 5
                while ((spec.job_id not in phases or "start" not in events.get(spec.job_id, {}))
                       and time.time() < deadline):
                    time.sleep(0.01)
                if spec.job_id in phases and "start" in events.get(spec.job_id, {}):
                    gates_seconds, container_seconds, workspace_seconds = phases[spec.job_id]
                    measures.to_start.append(events[spec.job_id]["start"] - enqueued_wall)
                    measures.gates.append(gates_seconds)
                    measures.workspace.append(workspace_seconds)
                    # Everything the worker adds beyond the container's own API life (create .. removed):
                    # RQ pickup and fork, the gates, the job files, the record (and a forge job's clone).
                    measures.added.append(measures.full[-1] - container_seconds)
                if run.outcome != "completed":
                    print(f"   job {spec.job_id} ended {run.outcome} {run.reason}: the measurement is void", flush=True)
                    failures += 1

            # Interleaved, so a slow phase of the engine hits every measure alike.
            print(f"==> {args.jobs} rounds of: docker run CLI, bare RQ job, local job, forge job", flush=True)
            cli, bare, local, forged = [], [], Measures(), Measures()
            for index in range(args.jobs):
                cli.append(timed(lambda: subprocess.run(cli_command, env=cli_env, check=True, capture_output=True)))
                bare.append(timed(bare_job))
                # force: the fake agent's report file leaves the folder dirty for the next round.
                pidispatch_job(JobSpec(job_id=f"run-bench-{uuid.uuid4().hex[:12]}", kind="local", folder=str(folder),
                                       target_type="local", flow="bench", task="benchmark", force=True), local)
                pidispatch_job(JobSpec(job_id=f"gh-bench-{uuid.uuid4().hex[:12]}", kind="github", repo="bench/repo",
                                       target_type="issue", number=index + 1, flow="bench", body="benchmark"), forged)

            real_cli, real = [], Measures()
            if args.real_jobs:
                print(f"==> {args.real_jobs} rounds of: docker run CLI of the real image, a real-pi job", flush=True)
                for index in range(args.real_jobs):
                    real_cli.append(real_cli_run(docker_host, scratch, real_image, model, index))
                    pidispatch_job(JobSpec(job_id=f"gh-real-{uuid.uuid4().hex[:12]}", kind="github",
                                           repo="bench/repo", target_type="issue", number=1000 + index,
                                           flow="bench", body="benchmark", image=real_image), real)
            print(f"==> {args.calls} provider calls, direct and through the gateway", flush=True)
            direct, gated = gateway_latency(model, args.calls)
        finally:
            for service in reversed(stack):
                service.stop()

    baseline = statistics.median(cli)
    print()
    print(f"{'measure':52} {'median ms':>10}")
    print(f"{'docker run CLI (baseline)':52} {median_ms(cli):10.1f}")
    print(f"{'bare RQ job, enqueue -> finished':52} {median_ms(bare):10.1f}")
    for name, measures in (("local job", local), ("forge job", forged)):
        print(f"{name + ', enqueue -> run record':52} {median_ms(measures.full):10.1f}")
        if measures.gates:
            print(f"{name + ', enqueue -> container start':52} {median_ms(measures.to_start):10.1f}")
            print(f"{name + ', the gates before the container':52} {median_ms(measures.gates):10.1f}   target < 20 ms")
            what = "token, branch, clone" if name == "forge job" else "the folder's git checks"
            print(f"{name + f', its workspace ({what})':52} {median_ms(measures.workspace):10.1f}"
                  "   (the job's work, not overhead)")
            print(f"{name + ', all the worker adds':52} {median_ms(measures.added):10.1f}   "
                  f"(RQ pickup, gates, files, record; bare RQ alone: {median_ms(bare):.1f})")
    if real.full:
        print(f"{'docker run CLI, real image and pi (baseline)':52} {median_ms(real_cli):10.1f}")
        print(f"{'real-pi job, enqueue -> run record':52} {median_ms(real.full):10.1f}")
        if real.added:
            print(f"{'real-pi job, all the worker adds':52} {median_ms(real.added):10.1f}")
    publish = [seconds for outcome, seconds in published.values() if outcome == "published"]
    if publish:
        print(f"{'publish step (push + pull request), forge jobs':52} {median_ms(publish):10.1f}   "
              f"({len(publish)} published; inside enqueue -> run record above)")
    print(f"{'provider call, direct':52} {median_ms(direct):10.2f}")
    print(f"{'provider call, through the gateway':52} {median_ms(gated):10.2f}")
    print(f"{'the gateway adds per call':52} {median_ms(gated) - median_ms(direct):10.2f}   target < 2 ms "
          f"(before per-call reservations: {GATEWAY_ADDED_BEFORE_MS})")
    print(f"{'ratio local job / docker run CLI':52} {statistics.median(local.full) / baseline:10.2f}   target <= 1.2")
    if real.full:
        print(f"{'ratio real-pi job / docker run CLI of it':52} "
              f"{statistics.median(real.full) / statistics.median(real_cli):10.2f}   target <= 1.2 "
              "(includes its clone)")
    print(f"{'ratio forge job / docker run CLI':52} {statistics.median(forged.full) / baseline:10.2f}   "
          "(includes its clone, which the CLI baseline does not do)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
