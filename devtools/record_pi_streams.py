"""Record real `pi -p --mode json` event streams for the runner's tests.

No model can be reached from a test machine, so this runs the real pi CLI (installed with npm into a
temporary folder) against a small local OpenAI-compatible server that answers with scripted replies,
and saves each run's stdout as a fixture under tests/payloads/pi/. Re-run it when pi's pinned version
changes (image/Dockerfile's PI_VERSION):

    python -m devtools.record_pi_streams [--pi-version 0.73.1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "payloads" / "pi"
DEFAULT_VERSION = "0.73.1"


def _chunk(delta=None, finish=None, usage=None):
    body = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake-coder",
            "choices": [] if usage else [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


def _tool_call(name, arguments):
    return [
        _chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": f"call_{name}", "type": "function",
                                                     "function": {"name": name, "arguments": json.dumps(arguments)}}]}),
        _chunk(finish="tool_calls"),
    ]


def _text(text):
    return [_chunk({"role": "assistant", "content": text}), _chunk(finish="stop")]


SCENARIOS = {
    # A tool call that writes a file, then a final answer: two turns, two model calls.
    "completed": [
        lambda: _tool_call("write", {"path": "NOTES.md", "content": "fixed\n"}),
        lambda: _text("I wrote NOTES.md."),
    ],
    "auth-refused": "401",
    "provider-down": "503",
}


class FakeModelServer(ThreadingHTTPServer):
    def __init__(self, scenario):
        super().__init__(("127.0.0.1", 0), FakeModelHandler)
        self.scenario = scenario
        self.calls = 0


class FakeModelHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        scenario = self.server.scenario
        if isinstance(scenario, str):
            body = json.dumps({"error": {"message": f"fake status {scenario}", "type": "fake"}}).encode()
            self.send_response(int(scenario))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        step = scenario[min(self.server.calls, len(scenario) - 1)]
        self.server.calls += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in step():
            self.wfile.write(piece)
        usage = {"prompt_tokens": 1200 * self.server.calls, "completion_tokens": 80,
                 "total_tokens": 1200 * self.server.calls + 80}
        self.wfile.write(_chunk(usage=usage))
        self.wfile.write(b"data: [DONE]\n\n")


def record(pi_version: str) -> None:
    with tempfile.TemporaryDirectory(prefix="pi-record-") as scratch:
        scratch = Path(scratch)
        print(f"==> installing @mariozechner/pi-coding-agent@{pi_version} (npm)", flush=True)
        subprocess.run(["npm", "install", "--silent", "--prefix", str(scratch / "npm"),
                        f"@mariozechner/pi-coding-agent@{pi_version}"], check=True)
        pi = scratch / "npm" / "node_modules" / ".bin" / "pi"
        OUT.mkdir(parents=True, exist_ok=True)
        for name, scenario in SCENARIOS.items():
            server = FakeModelServer(scenario)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            agent_dir = scratch / f"agent-{name}"
            agent_dir.mkdir()
            (agent_dir / "models.json").write_text(json.dumps({"providers": {"fakeai": {
                "baseUrl": f"http://127.0.0.1:{server.server_address[1]}/v1", "api": "openai-completions",
                "apiKey": "FAKEAI_API_KEY", "compat": {"supportsDeveloperRole": False,
                                                       "supportsReasoningEffort": False},
                "models": [{"id": "fake-coder", "cost": {"input": 3, "output": 15, "cacheRead": 0.3,
                                                          "cacheWrite": 3.75}}]}}}))
            workspace = scratch / f"workspace-{name}"
            workspace.mkdir()
            env = {"PATH": os.environ["PATH"], "HOME": str(scratch), "PI_CODING_AGENT_DIR": str(agent_dir),
                   "PI_OFFLINE": "1", "PI_TELEMETRY": "0", "FAKEAI_API_KEY": "fake-key"}
            result = subprocess.run(
                [str(pi), "-p", "--mode", "json", "--no-session", "--provider", "fakeai", "--model", "fake-coder",
                 "Write NOTES.md saying fixed."],
                cwd=workspace, env=env, capture_output=True, text=True, timeout=120,
            )
            server.shutdown()
            (OUT / f"{name}.jsonl").write_text(result.stdout)
            (OUT / f"{name}.exit").write_text(f"{result.returncode}\n")
            print(f"==> {name}: exit {result.returncode}, {len(result.stdout.splitlines())} events, "
                  f"{server.calls} model calls", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pi-version", default=DEFAULT_VERSION)
    record(parser.parse_args().pi_version)


if __name__ == "__main__":
    main()
