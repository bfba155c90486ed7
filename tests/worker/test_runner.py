"""The production image's runner (image/runner/runner.mjs), driven by a fake `pi` that replays event
streams recorded from the real pi CLI (tests/payloads/pi, made by devtools/record_pi_streams.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from apps.worker.sandbox.exitline import parse_exit_line
from tests.conftest import PAYLOADS, ROOT

RUNNER = ROOT / "image" / "runner" / "runner.mjs"
FAKE_PI = Path(__file__).resolve().parents[1] / "fake_pi" / "pi"


@pytest.fixture
def job_dir(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "prompt.md").write_text("Fix the footer.\n")
    return folder


def run_runner(job_dir, tmp_path, stream="completed", exit_code=0, **env):
    environment = {
        "PATH": os.environ["PATH"], "PI_BIN": str(FAKE_PI), "PI_RUNNER_JOB_DIR": str(job_dir),
        "FAKE_PI_STREAM": str(PAYLOADS / "pi" / f"{stream}.jsonl"), "FAKE_PI_EXIT": str(exit_code),
        "FAKE_PI_ARGS": str(tmp_path / "pi-args"), "PI_FLOW": "fix-bug", "PI_PROVIDER": "fakeai",
        "PI_MODEL": "fake-coder", "PI_MAX_TURNS": "30", **env,
    }
    return subprocess.run(["node", str(RUNNER)], env=environment, capture_output=True, timeout=60)


def exit_line(result) -> dict:
    return json.loads(result.stdout.decode().strip().splitlines()[-1])


def test_a_finished_pi_run_exits_0_with_turns_and_a_per_model_ledger(job_dir, tmp_path):
    result = run_runner(job_dir, tmp_path)

    assert result.returncode == 0
    line = exit_line(result)
    assert line["event"] == "exit" and line["code"] == 0 and line["turns"] == 2
    assert line["tokens"] == {"input": 3600, "output": 160, "total": 3760, "cost": 0.0132}
    assert line["usage"] == {"v": 1, "models": [{"provider": "fakeai", "model": "fake-coder", "calls": 2,
                                                 "input": 3600, "output": 160, "cacheRead": 0, "cacheWrite": 0,
                                                 "total": 3760, "cost": 0.0132}]}
    # The worker's own parser reads the same numbers from the runner's output.
    telemetry = parse_exit_line(result.stdout, 0)
    assert (telemetry.turns, telemetry.tokens_total, telemetry.cost) == (2, 3760, Decimal("0.013200"))
    assert telemetry.usage["models"][0]["calls"] == 2


def test_pi_is_invoked_in_json_print_mode_with_the_prompt_as_a_file(job_dir, tmp_path):
    run_runner(job_dir, tmp_path, PI_EXCLUDE_TOOLS="bash", PI_RUNNER_SESSION_DIR=str(tmp_path / "none"))

    args = (tmp_path / "pi-args").read_text().splitlines()
    assert args[:4] == ["-p", "--mode", "json", "--no-session"]
    assert args[args.index("--provider") + 1] == "fakeai" and args[args.index("--model") + 1] == "fake-coder"
    assert args[args.index("--tools") + 1] == "read,edit,write"
    assert args[-1] == f"@{job_dir / 'prompt.md'}"


def test_the_overlay_packages_and_skill_folders_the_worker_lists_become_pis_flags(job_dir, tmp_path):
    """/job/pi-resources.json (apps/worker/sandbox/pi_overlay.py): packages as -e, folders as --skill and
    --prompt-template; a path that is not there, not absolute or not a string is left out."""
    for name in ("overlay", "pack", "skills", "prompts"):
        (tmp_path / name).mkdir()
    (job_dir / "pi-resources.json").write_text(json.dumps({
        "extensions": [str(tmp_path / "overlay"), str(tmp_path / "pack"), "relative/pack", str(tmp_path / "gone")],
        "skills": [str(tmp_path / "skills"), 7], "promptTemplates": [str(tmp_path / "prompts")]}))
    run_runner(job_dir, tmp_path)
    args = (tmp_path / "pi-args").read_text().splitlines()
    flags = args[args.index("fake-coder") + 1:-1]
    assert flags == ["-e", str(tmp_path / "overlay"), "-e", str(tmp_path / "pack"), "--skill", str(tmp_path / "skills"),
                     "--prompt-template", str(tmp_path / "prompts")]

    (job_dir / "pi-resources.json").write_text("not json")
    assert run_runner(job_dir, tmp_path).returncode == 0  # an unreadable file: pi runs without it
    assert "-e" not in (tmp_path / "pi-args").read_text().splitlines()


def test_a_resume_job_continues_the_session_in_its_mounted_folder(job_dir, tmp_path):
    """The worker mounts /session only for a `run.resume` job: pi then keeps its transcript there."""
    sessions = tmp_path / "session"
    sessions.mkdir()
    run_runner(job_dir, tmp_path, PI_RUNNER_SESSION_DIR=str(sessions))
    args = (tmp_path / "pi-args").read_text().splitlines()
    assert "--no-session" not in args and args[args.index("--session") + 1] == str(sessions / "session.jsonl")

    run_runner(job_dir, tmp_path, PI_RUNNER_SESSION_DIR=str(tmp_path / "not-mounted"))
    assert "--no-session" in (tmp_path / "pi-args").read_text().splitlines()


def test_a_command_job_sends_the_slash_command(job_dir, tmp_path):
    run_runner(job_dir, tmp_path, PI_FLOW="", PI_COMMAND="release-notes")
    assert (tmp_path / "pi-args").read_text().splitlines()[-1] == "/release-notes"


def test_refused_credentials_are_a_policy_stop(job_dir, tmp_path):
    result = run_runner(job_dir, tmp_path, stream="auth-refused")
    assert result.returncode == 2 and exit_line(result)["reason"] == "provider-auth-refused"


def test_a_provider_outage_is_retried_infrastructure(job_dir, tmp_path):
    result = run_runner(job_dir, tmp_path, stream="provider-down")
    assert result.returncode == 1 and "reason" not in exit_line(result)


def test_the_turn_budget_stops_pi(job_dir, tmp_path):
    result = run_runner(job_dir, tmp_path, PI_MAX_TURNS="1", FAKE_PI_DELAY="0.05")
    assert result.returncode == 2 and exit_line(result)["reason"] == "turn-budget"


def test_tokens_are_not_the_runners_to_bound(job_dir, tmp_path):
    """The job's gateway holds it to its token budget (tests/worker/test_real_pi.py); a budget in the runner's own
    environment, which the container could change, stops nothing."""
    result = run_runner(job_dir, tmp_path, PI_MAX_TOKENS="2000", FAKE_PI_DELAY="0.05")
    assert result.returncode == 0 and exit_line(result)["tokens"]["total"] > 2000


def test_the_runner_speaks_the_workers_protocol():
    from apps.worker.sandbox import image_contract

    assert f'export const RUNNER_PROTOCOL = "{image_contract.RUNNER_PROTOCOL}";' in RUNNER.read_text()


def test_each_gateway_socket_gets_a_loopback_forwarder(job_dir, tmp_path):
    """The runner listens on loopback (8080 and 3128 in the image) and pipes every byte to the gateway's sockets."""
    import socket
    import threading

    egress = tmp_path / "egress"
    egress.mkdir()
    heard = {}
    servers = []
    for name in ("provider.sock", "proxy.sock"):
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(egress / name))
        server.listen()
        servers.append((name, server))

    def answer(name, server):
        conn, _ = server.accept()
        heard[name] = conn.recv(1024)
        conn.sendall(b"pong-" + name.encode())
        conn.close()

    threads = [threading.Thread(target=answer, args=pair, daemon=True) for pair in servers]
    for thread in threads:
        thread.start()
    ports = []
    for _ in range(2):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            ports.append(free.getsockname()[1])
    probe = (f"import socket\nfor port in {tuple(ports)}:\n s = socket.create_connection(('127.0.0.1', port))\n"
             f" s.sendall(b'ping'); print(s.recv(64).decode())\n")
    # The fake pi is this probe: it talks to the forwarders the runner started before spawning it.
    fake_pi = tmp_path / "pi"
    fake_pi.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"{probe}\"\n")
    fake_pi.chmod(0o755)
    result = run_runner(job_dir, tmp_path, PI_BIN=str(fake_pi), PI_RUNNER_EGRESS_DIR=str(egress),
                        PI_RUNNER_EGRESS_PORTS=",".join(map(str, ports)))
    for thread in threads:
        thread.join(10)
    assert heard == {"provider.sock": b"ping", "proxy.sock": b"ping"}
    assert "pong-provider.sock" in result.stdout.decode() and "pong-proxy.sock" in result.stdout.decode()


def test_pi_crashing_is_infrastructure(job_dir, tmp_path):
    assert run_runner(job_dir, tmp_path, exit_code=3).returncode == 1


def test_pi_missing_is_infrastructure_with_an_exit_line(job_dir, tmp_path):
    result = run_runner(job_dir, tmp_path, PI_BIN=str(tmp_path / "no-such-pi"))
    assert result.returncode == 1 and exit_line(result)["event"] == "exit"


def test_an_empty_job_is_a_policy_refusal(job_dir, tmp_path):
    (job_dir / "prompt.md").write_text("")
    result = run_runner(job_dir, tmp_path)
    assert result.returncode == 2 and exit_line(result)["reason"] == "runner-config"


def test_sigterm_stops_pi_and_still_reports(job_dir, tmp_path):
    environment = {
        "PATH": os.environ["PATH"], "PI_BIN": str(FAKE_PI), "PI_RUNNER_JOB_DIR": str(job_dir),
        "FAKE_PI_STREAM": str(PAYLOADS / "pi" / "completed.jsonl"), "FAKE_PI_DELAY": "1", "PI_FLOW": "fix-bug",
    }
    process = subprocess.Popen(["node", str(RUNNER)], env=environment, stdout=subprocess.PIPE)
    time.sleep(1.5)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=20)

    assert process.returncode == 1
    assert json.loads(output.decode().strip().splitlines()[-1])["event"] == "exit"
