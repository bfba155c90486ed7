"""Receiver benchmark: signed GitHub deliveries through the full intake path versus a bare Django view, both
served by the same gunicorn (with the inbox replayer beside it, as deployed), in the same run, side by side.

    python bench/receiver.py                     # defaults: 4 sync workers, 8 clients x 300 requests x 5 rounds
    python bench/receiver.py --rounds 9 --rate 100 --seconds 20
    python bench/receiver.py --redis-appendfsync everysec   # Redis as most deployments run it (see README)

The full path is the real one: HMAC check, inbox row, trigger matching, the semantic-dedup key and an RQ
enqueue (every delivery targets another issue, so none is swallowed). The bare view reads the same body and
answers JSON through the same middleware. Targets (issue 3): the full path costs at most 2x the bare view,
and its p99 stays under 50 ms at 100 deliveries/s.

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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-webhook-secret"
SELF_ID = "1"
PAYLOAD = json.loads((ROOT / "tests" / "payloads" / "github" / "issues_labeled.json").read_text())


# --- the server side (imported by gunicorn as `bench.receiver:application`) ------------------------------------

def _bare(request):
    from django.http import JsonResponse

    request.body  # read the same bytes the hook reads
    return JsonResponse({"status": "ok"}, status=202)


def _application():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pidispatch_site.settings")
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application

    settings.ROOT_URLCONF = "bench.receiver"
    application = get_wsgi_application()
    from apps.receiver.forge_config import forge_config

    forge_config()  # the same start gate as pidispatch_site.wsgi
    return application


def __getattr__(name):  # lazily, so importing this module as a script does not set Django up
    if name == "urlpatterns":
        from django.urls import path
        from django.views.decorators.csrf import csrf_exempt

        import pidispatch_site.urls

        return [path("bench/bare", csrf_exempt(_bare))] + pidispatch_site.urls.urlpatterns
    if name == "application":
        return _application()
    raise AttributeError(name)


# --- the client side -----------------------------------------------------------------------------------------

def _delivery(number: int, run: str) -> tuple[bytes, dict]:
    payload = json.loads(json.dumps(PAYLOAD))
    payload["issue"]["number"] = number
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
    def __init__(self, name: str, path: str):
        self.name, self.path = name, path
        self.counter = 0
        self.lock = threading.Lock()

    def next_request(self, run: str) -> tuple[bytes, dict]:
        with self.lock:
            self.counter += 1
            number = self.counter
        return _delivery(number, run)


def closed_loop(port: int, target: Target, run: str, clients: int, requests: int) -> dict:
    latencies, failures = [], []

    def client():
        for _ in range(requests):
            body, headers = target.next_request(run)
            status, seconds = _post(port, target.path, body, headers)
            latencies.append(seconds)
            if status != 202:
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
                if status != 202:
                    failures.append(status)

    threads = [threading.Thread(target=sender) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {**_percentiles(latencies), "failures": failures}


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
    args = parser.parse_args()

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
            # What a deployment runs beside the web server (and what checkpoints SQLite's log off the hook path).
            replayer = subprocess.Popen([*manage, "replay_deliveries", "--follow"], env=env, cwd=ROOT,
                                        stdout=subprocess.DEVNULL, start_new_session=True)
            _wait_for(port)
            bare, full = Target("bare view", "/bench/bare"), Target("full intake", "/hooks/github")
            run = f"bench{int(time.time())}"

            for target in (bare, full):  # warm up both (imports, connections, SQLite pages)
                closed_loop(port, target, f"{run}-warm", 4, 25)
            print(f"receiver bench: gunicorn {args.workers} sync workers, "
                  f"{'PostgreSQL' if 'postgres' in env['DATABASE_URL'] else 'SQLite synchronous=' + env.get('SQLITE_SYNCHRONOUS', 'FULL')}"
                  f", private Redis (appendfsync {args.redis_appendfsync})")
            print(f"closed loop, {args.clients} clients x {args.requests} signed deliveries per round, "
                  f"{args.rounds} rounds alternating (this VM's speed drifts; the median round decides):")
            closed = {"bare view": [], "full intake": []}
            ratios = []
            for round_number in range(1, args.rounds + 1):
                line = f"  round {round_number}:"
                for target in (bare, full):
                    result = closed_loop(port, target, run, args.clients, args.requests)
                    closed[target.name].append(result)
                    failed = f" {len(result['failures'])} failed" if result["failures"] else ""
                    line += (f"  {target.name} {result['rate']:5.0f}/s (p50 {result['p50']:4.1f} ms, "
                             f"p99 {result['p99']:5.1f} ms){failed}")
                ratios.append(closed["bare view"][-1]["rate"] / closed["full intake"][-1]["rate"])
                print(f"{line}  ratio {ratios[-1]:.2f}x")
            ratio = statistics.median(ratios)
            rates = {name: statistics.median(r["rate"] for r in results) for name, results in closed.items()}
            print(f"  median: bare view {rates['bare view']:.0f}/s, full intake {rates['full intake']:.0f}/s; "
                  f"ratio full/bare {ratio:.2f}x the cost per delivery   "
                  f"target <= 2x: {'OK' if ratio <= 2 else 'MISSED'}")

            print(f"open loop, {args.rate:g} deliveries/s for {args.seconds:g} s:")
            opened = {}
            for target in (bare, full):
                opened[target.name] = result = open_loop(port, target, f"{run}-open", args.rate, args.seconds)
                print(f"  {target.name:12} p50 {result['p50']:6.1f} ms   p99 {result['p99']:6.1f} ms"
                      + (f"   {len(result['failures'])} failed" if result["failures"] else ""))
            p99 = opened["full intake"]["p99"]
            print(f"  full intake p99 {p99:.1f} ms   target < 50 ms: {'OK' if p99 < 50 else 'MISSED'}")
            failed = any(r["failures"] for r in (*closed["bare view"], *closed["full intake"], *opened.values()))
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
