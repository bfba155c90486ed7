"""Receiver benchmark: signed GitHub deliveries through the full intake path versus a bare Django view, both
served by the same gunicorn (with the inbox replayer beside it, as deployed), in the same run, side by side.

    python bench/receiver.py                     # defaults: 4 sync workers, 8 clients x 300 requests x 5 rounds
    python bench/receiver.py --rounds 9 --rate 100 --seconds 20
    python bench/receiver.py --redis-appendfsync everysec   # Redis as most deployments run it (see README)
    python bench/receiver.py --ignored           # deliveries no trigger matches, as most webhooks are
    python bench/receiver.py --layers            # also the full path without its inbox writes, and without both
                                                 # those and its enqueue: what each layer costs
    python bench/receiver.py --fast-paths        # also the full path with each hand-made fast path turned off
                                                 # (ORM writes; every write waiting for the disk)

The full path is the real one: HMAC check, inbox row, trigger matching, the semantic-dedup key and an RQ
enqueue (every delivery targets another issue, so none is swallowed). The bare view reads the same body and
answers JSON through the same middleware. Targets (issue 3, restated): the full path costs at most 2.5x the bare view,
and its p99 stays under 50 ms at 100 deliveries/s. The open loop also times the disk's own fsync (a probe
file beside the databases), so a latency spike can be told apart from the disk stalling under it.

It starts its own redis-server and (unless DATABASE_URL is set) an SQLite database in a temporary folder,
and stops both when done.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-webhook-secret"
SELF_ID = "1"
PAYLOAD = json.loads((ROOT / "tests" / "payloads" / "github" / "issues_labeled.json").read_text())


# --- the server side (imported by gunicorn as `bench.receiver:application`) ------------------------------------

def _bare(request):
    from django.http import JsonResponse

    request.body  # noqa: B018 (read the same bytes the hook reads)
    return JsonResponse({"status": "ok"}, status=202)


class _SkippedInboxWrites:
    """`--layers`: the inbox's row writes made free (the row gets a pk, nothing is written)."""

    _next_pk = 0

    @classmethod
    def insert(cls, instance, *, wait_for_disk=True):
        cls._next_pk -= 1  # negative: never a real row's
        instance.pk = cls._next_pk
        instance._state.adding = False
        return instance

    @staticmethod
    def update(instance, names, *, wait_for_disk=True):
        pass


def _skipped_enqueue(spec, queue_name, claims=()):
    from apps.worker.jobs import Enqueued

    return Enqueued("created")


def _without_layers(*, enqueue: bool):
    """The GitHub hook with its inbox writes (and, `enqueue=False`, its enqueue) skipped, for `--layers`.
    A sync worker serves one request at a time, so swapping the modules' names around one call is safe."""
    from apps.receiver import dispatch, intake, views

    hook = views.github_hook

    def view(request):
        saved = intake.rowwrites, dispatch.enqueue
        intake.rowwrites = _SkippedInboxWrites
        if not enqueue:
            dispatch.enqueue = _skipped_enqueue
        try:
            return hook(request)
        finally:
            intake.rowwrites, dispatch.enqueue = saved

    return view


# `--fast-paths`: each hand-made fast path of the hook turned off, one at a time, to learn what it saves
# (docs/architecture.md, "Hand-made fast paths": the ones that saved under a tenth are gone).

@contextmanager
def _durability(wait_for_disk: bool):
    """rowwrites' durability rule around a write made some other way: one that need not wait for the disk
    commits with synchronous=NORMAL."""
    from django.db import connection

    if wait_for_disk:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous=NORMAL")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=FULL")


class _OrmWrites:
    """Django's own `save()` for both inbox writes (statement built by the ORM each time), durability unchanged."""

    @staticmethod
    def insert(instance, *, wait_for_disk=True):
        with _durability(wait_for_disk):
            instance.save(force_insert=True)
        return instance

    @staticmethod
    def update(instance, names, *, wait_for_disk=True):
        with _durability(wait_for_disk):
            instance.save(update_fields=names)


class _AllWritesWait:
    """Every inbox write waits for the disk, also the two of a queued delivery (whose job is on disk in Redis)."""

    @staticmethod
    def insert(instance, *, wait_for_disk=True):
        from pidispatch_site import rowwrites

        return rowwrites.insert(instance, wait_for_disk=True)

    @staticmethod
    def update(instance, names, *, wait_for_disk=True):
        from pidispatch_site import rowwrites

        return rowwrites.update(instance, names, wait_for_disk=True)


def _with_writes(writes):
    """The GitHub hook with the inbox's writes made by `writes` instead of rowwrites."""
    from apps.receiver import intake, views

    hook = views.github_hook

    def view(request):
        saved, intake.rowwrites = intake.rowwrites, writes
        try:
            return hook(request)
        finally:
            intake.rowwrites = saved

    return view


def _application():
    """The deployed WSGI module (its start gate and all), serving this module's URLs."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pidispatch_site.settings")
    from django.conf import settings

    settings.ROOT_URLCONF = "bench.receiver"
    from pidispatch_site.wsgi import application

    return application


def __getattr__(name):  # lazily, so importing this module as a script does not set Django up
    if name == "urlpatterns":
        from django.urls import path
        from django.views.decorators.csrf import csrf_exempt

        import pidispatch_site.urls

        return [
            path("bench/bare", csrf_exempt(_bare)),
            path("bench/hook-without-inbox", csrf_exempt(_without_layers(enqueue=True))),
            path("bench/hook-without-inbox-or-enqueue", csrf_exempt(_without_layers(enqueue=False))),
            path("bench/hook-orm-writes", csrf_exempt(_with_writes(_OrmWrites))),
            path("bench/hook-all-writes-wait", csrf_exempt(_with_writes(_AllWritesWait))),
        ] + pidispatch_site.urls.urlpatterns
    if name == "application":
        return _application()
    raise AttributeError(name)


# --- the client side -----------------------------------------------------------------------------------------

def _delivery(number: int, run: str, ignored: bool) -> tuple[bytes, dict]:
    payload = json.loads(json.dumps(PAYLOAD))
    payload["issue"]["number"] = number
    if ignored:  # a label no trigger names: the delivery most webhooks are
        payload["label"] = {"name": "docs"}
        payload["issue"]["labels"] = [{"name": "docs"}]
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return body, {"Content-Type": "application/json", "X-GitHub-Event": "issues",
                  "X-GitHub-Delivery": f"{run}-{number}", "X-Hub-Signature-256": signature}


def _post(port: int, path: str, body: bytes, headers: dict) -> tuple[int, float]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status, time.perf_counter() - started
    finally:
        connection.close()


class Target:
    def __init__(self, name: str, path: str, *, ignored: bool = False):
        self.name, self.path, self.ignored = name, path, ignored
        self.expected_status = 200 if ignored else 202
        self.counter = 0
        self.lock = threading.Lock()

    def next_request(self, run: str) -> tuple[bytes, dict]:
        with self.lock:
            self.counter += 1
            number = self.counter
        return _delivery(number, run, self.ignored)


def closed_loop(port: int, target: Target, run: str, clients: int, requests: int) -> dict:
    latencies, failures = [], []

    def client():
        for _ in range(requests):
            body, headers = target.next_request(run)
            status, seconds = _post(port, target.path, body, headers)
            latencies.append(seconds)
            if status != target.expected_status:
                failures.append(status)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {"rate": len(latencies) / elapsed, **_percentiles(latencies), "failures": failures}


def open_loop(port: int, target: Target, run: str, rate: float, seconds: float) -> dict:
    """Requests sent on a fixed schedule; latency counts from the scheduled instant (queueing included)."""
    total = int(rate * seconds)
    latencies, failures, lock = [], [], threading.Lock()
    start = time.perf_counter() + 0.2
    schedule = iter(range(total))

    def sender():
        while True:
            with lock:
                index = next(schedule, None)
            if index is None:
                return
            due = start + index / rate
            time.sleep(max(0.0, due - time.perf_counter()))
            body, headers = target.next_request(run)
            status, _ = _post(port, target.path, body, headers)
            finished = time.perf_counter()
            with lock:
                latencies.append(finished - due)
                if status != target.expected_status:
                    failures.append(status)

    threads = [threading.Thread(target=sender) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {**_percentiles(latencies), "failures": failures}


class DiskProbe:
    """Appends a few bytes to a file and fdatasyncs it every 50 ms while running: the disk's own sync latency
    in the same seconds as a measurement (rare enough not to load the disk itself)."""

    def __init__(self, path: Path):
        self.path, self.latencies = path, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not self._stop.wait(0.05):
                os.write(descriptor, b"probe\n")
                started = time.perf_counter()
                os.fdatasync(descriptor)
                self.latencies.append(time.perf_counter() - started)
        finally:
            os.close(descriptor)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        if not self.latencies:
            return "disk fsync: no sample"
        ordered = sorted(self.latencies)
        return f"disk fsync p50 {statistics.median(ordered) * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"


def _failed(result: dict) -> str:
    return f" {len(result['failures'])} failed" if result["failures"] else ""


def _percentiles(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {"p50": statistics.median(ordered) * 1000, "p99": ordered[int(len(ordered) * 0.99) - 1] * 1000}


# --- orchestration -------------------------------------------------------------------------------------------

def _wait_for(port: int, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/healthz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("gunicorn did not answer /healthz; see its output above")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients in the closed loop")
    parser.add_argument("--requests", type=int, default=300, help="requests per client in each closed-loop round")
    parser.add_argument("--rounds", type=int, default=5, help="closed-loop rounds, bare and full alternating")
    parser.add_argument("--rate", type=float, default=100, help="deliveries per second in the open loop")
    parser.add_argument("--seconds", type=float, default=10, help="length of the open loop")
    parser.add_argument("--redis-appendfsync", choices=("always", "everysec"), default="always",
                        help="Redis's fsync policy: always (the README's advice: a queued delivery survives a "
                             "power cut) or everysec (a power cut can lose its last second)")
    parser.add_argument("--ignored", action="store_true",
                        help="deliveries that match no trigger (answered 200 ignored), as most webhooks a "
                             "deployment receives are, instead of ones that queue a job")
    parser.add_argument("--layers", action="store_true",
                        help="also time the full path without its inbox writes, and without those and its enqueue "
                             "(gunicorn serves both beside the real hook): what each layer costs against the bare view")
    parser.add_argument("--fast-paths", action="store_true",
                        help="also time the full path with each hand-made fast path turned off, one at a time: "
                             "what each one saves (SQLite only)")
    args = parser.parse_args()
    if args.fast_paths and "postgres" in os.environ.get("DATABASE_URL", ""):
        parser.error("--fast-paths measures SQLite's fast paths: unset DATABASE_URL")

    sys.path.insert(0, str(ROOT))
    from devtools import services

    with tempfile.TemporaryDirectory(prefix="pidispatch-bench-") as scratch:
        port_redis = services.free_port()
        # Persistent (append-only file), as a deployment's Redis must be: it holds settled deliveries' jobs.
        redis = services.start_redis(Path(scratch) / "redis", port_redis, persistent=True)
        server = replayer = None
        try:
            import redis as redis_py

            redis_py.Redis(port=port_redis).config_set("appendfsync", args.redis_appendfsync)
            env = {
                **os.environ,
                "REDIS_URL": f"redis://127.0.0.1:{port_redis}/0",
                "DATABASE_URL": os.environ.get("DATABASE_URL") or f"sqlite:///{scratch}/bench.sqlite3",
                "PI_VAR_DIR": scratch,
                "GITHUB_WEBHOOK_SECRET": SECRET, "GITHUB_SELF_ID": SELF_ID,
                "PI_LOG_LEVEL": "WARNING", "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
            }
            for name in ("GITLAB_WEBHOOK_MODE", "GITLAB_WEBHOOK_SECRET", "FORGEJO_WEBHOOK_SECRET",
                         "AZURE_WEBHOOK_MODE", "AZURE_WEBHOOK_SECRET"):
                env.pop(name, None)
            manage = [sys.executable, str(ROOT / "manage.py")]
            subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, cwd=ROOT, check=True)
            subprocess.run([*manage, "shell", "-c",
                            "from apps.receiver.models import Trigger; Trigger.objects.create(position=0, "
                            "kind='github', on_type='label', label_any=['pi'], flow='fix-bug')"],
                           env=env, cwd=ROOT, check=True)
            port = services.free_port()
            gunicorn = str(Path(sys.executable).parent / "gunicorn")
            server = subprocess.Popen([gunicorn, "bench.receiver:application", "--bind", f"127.0.0.1:{port}",
                                       "--workers", str(args.workers), "--no-control-socket", "--log-level", "warning"],
                                      env=env, cwd=ROOT, start_new_session=True)
            # What a deployment runs beside the web server.
            replayer = subprocess.Popen([*manage, "replay_deliveries", "--follow"], env=env, cwd=ROOT,
                                        stdout=subprocess.DEVNULL, start_new_session=True)
            _wait_for(port)
            bare = Target("bare view", "/bench/bare")
            full = Target("full intake", "/hooks/github", ignored=args.ignored)
            layers = [Target("without inbox writes", "/bench/hook-without-inbox", ignored=args.ignored),
                      Target("without inbox writes or enqueue", "/bench/hook-without-inbox-or-enqueue",
                             ignored=args.ignored)]
            fast_paths = [  # (the fast path switched off, the target serving the hook without it)
                ("single-row writes (rowwrites.py)",
                 Target("ORM writes", "/bench/hook-orm-writes", ignored=args.ignored)),
                ("writes that need not wait (wait_for_disk=False)",
                 Target("every write waits", "/bench/hook-all-writes-wait", ignored=args.ignored)),
            ] if args.fast_paths else []
            variants = [target for _, target in fast_paths]
            closed_targets = (bare, full, *(layers if args.layers else ()), *variants)
            run = f"bench{int(time.time())}"

            for target in closed_targets:  # warm up (imports, connections, SQLite pages)
                closed_loop(port, target, f"{run}-warm", 4, 25)
            database = ("PostgreSQL" if "postgres" in env["DATABASE_URL"]
                        else "SQLite synchronous=" + env.get("SQLITE_SYNCHRONOUS", "FULL"))
            print(f"receiver bench: gunicorn {args.workers} sync workers, {database}"
                  f", private Redis (appendfsync {args.redis_appendfsync}); "
                  f"{'ignored deliveries (no trigger matches)' if args.ignored else 'every delivery queues a job'}")
            print(f"closed loop, {args.clients} clients x {args.requests} signed deliveries per round, "
                  f"{args.rounds} rounds alternating (this VM's speed drifts; the median round decides):")
            closed = {target.name: [] for target in closed_targets}
            ratios = []
            for round_number in range(1, args.rounds + 1):
                # Each round starts one target later, so no target always runs first after the previous round.
                shift = (round_number - 1) % len(closed_targets)
                for target in closed_targets[shift:] + closed_targets[:shift]:
                    closed[target.name].append(closed_loop(port, target, run, args.clients, args.requests))
                ratios.append(closed["bare view"][-1]["rate"] / closed["full intake"][-1]["rate"])
                line = f"  round {round_number}:"
                for target in (bare, full):
                    result = closed[target.name][-1]
                    line += (f"  {target.name} {result['rate']:5.0f}/s (p50 {result['p50']:4.1f} ms, "
                             f"p99 {result['p99']:5.1f} ms){_failed(result)}")
                print(f"{line}  ratio {ratios[-1]:.2f}x")
                if args.layers:
                    print("           " + "".join(
                        f"  {target.name} {closed[target.name][-1]['rate']:5.0f}/s{_failed(closed[target.name][-1])}"
                        f"  ratio {closed['bare view'][-1]['rate'] / closed[target.name][-1]['rate']:.2f}x"
                        for target in layers))
                if variants:
                    print("           " + "".join(
                        f"  {target.name} {closed[target.name][-1]['rate']:5.0f}/s{_failed(closed[target.name][-1])}"
                        f" ({closed['full intake'][-1]['rate'] / closed[target.name][-1]['rate'] - 1:+.0%})"
                        for target in variants))
            ratio = statistics.median(ratios)
            rates = {name: statistics.median(r["rate"] for r in results) for name, results in closed.items()}
            print(f"  median: bare view {rates['bare view']:.0f}/s, full intake {rates['full intake']:.0f}/s; "
                  f"ratio full/bare {ratio:.2f}x the cost per delivery   "
                  f"target <= 2.5x: {'OK' if ratio <= 2.5 else 'MISSED'}")
            for target in layers if args.layers else ():
                layer_ratios = [b["rate"] / r["rate"]
                                for b, r in zip(closed["bare view"], closed[target.name], strict=True)]
                print(f"  median ratio {target.name}: {statistics.median(layer_ratios):.2f}x")

            if fast_paths:
                print("  what each fast path saves (the full path's cost per delivery with it turned off, median "
                      "round; kept where it saves at least 10%):")
            for fast_path, target in fast_paths:
                extra = statistics.median(f["rate"] / r["rate"] - 1
                                          for f, r in zip(closed["full intake"], closed[target.name], strict=True))
                print(f"    {fast_path:62} {extra:+6.1%}   {'earns its keep' if extra >= 0.10 else 'under 10%'}")

            print(f"open loop, {args.rate:g} deliveries/s for {args.seconds:g} s:")
            opened = {}
            for target in (bare, full):
                with DiskProbe(Path(scratch) / f"disk-probe-{len(opened)}") as disk:
                    opened[target.name] = result = open_loop(port, target, f"{run}-open", args.rate, args.seconds)
                print(f"  {target.name:12} p50 {result['p50']:6.1f} ms   p99 {result['p99']:6.1f} ms   "
                      f"({disk.summary()})"
                      + (f"   {len(result['failures'])} failed" if result["failures"] else ""))
            p99 = opened["full intake"]["p99"]
            print(f"  full intake p99 {p99:.1f} ms   target < 50 ms: {'OK' if p99 < 50 else 'MISSED'}")
            results = [result for rounds in closed.values() for result in rounds] + list(opened.values())
            failed = any(result["failures"] for result in results)
            return 1 if failed else 0
        finally:
            if server is not None:
                server.terminate()
                server.wait(30)
            if replayer is not None:
                replayer.terminate()
                replayer.wait(30)
            redis.stop()


if __name__ == "__main__":
    sys.exit(main())
