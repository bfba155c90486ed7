"""A local model provider that answers from scripts, in each API shape pi speaks.

No model can be reached from a test machine, so the real pi runs against this: OpenAI chat completions
(`/chat/completions`), OpenAI responses (`/responses`), Anthropic messages (`/v1/messages`) and Google
(`/models/<model>:streamGenerateContent` / `:generateContent`), streamed as server-sent events or as one JSON
body, each with its own usage shape. It checks the key each API carries (401 otherwise) and remembers every
request it answered, so a test can say what the provider saw.

A conversation's script is chosen by a marker `scripted:<name>` anywhere in the request (the issue text ends
up in pi's prompt), else the default one; the step is the number of tool results the conversation already
holds, so the server keeps no state between calls:

    provider = ScriptedProvider(key="sk-test")
    provider.scenarios["edit"] = [ToolCall("edit", {...}), ToolCall("bash", {"command": "env"}), Text("Done.")]
    provider.url   # http://127.0.0.1:<port>  (base URLs: + "/v1" for OpenAI shapes, as is for Anthropic)

For the gateway's tests it also answers Anthropic's `count_tokens` and Google's `:countTokens`, remembers every
request whatever its path or method (`requests`: what reached it, the key included or not), reports usage from
the request when `usage_for(body, size)` is set (a provider that answers up to the ceiling it was sent), waits
`delay` seconds per answer, and keeps the most calls it ever served at once (`most_at_once`).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MARKER = re.compile(r"scripted:([a-z0-9][a-z0-9-]{0,62})")
DEMO_FILE = "NOTES.md"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Status:
    """Answer with this HTTP status and a JSON error, as the provider would."""

    code: int


Step = ToolCall | Text | Status

# What `make run`'s demo agent does: reads the README, writes a note, says so.
DEMO_SCENARIO = [
    ToolCall("read", {"path": "README.md"}),
    ToolCall("write", {"path": DEMO_FILE, "content": "# Notes\n\nThe scripted demo model was here.\n"}),
    Text(f"I read README.md and wrote {DEMO_FILE}."),
]


def default_usage(step: int) -> tuple[int, int]:
    """(prompt tokens, completion tokens) reported for the call at `step`: a growing prompt, as a real one."""
    return 1200 * (step + 1), 80


@dataclass
class Seen:
    """One request the provider answered."""

    api: str
    path: str
    headers: dict[str, str]
    body: str
    scenario: str
    step: int
    key_accepted: bool
    status: int = 200
    usage: tuple[int, int] = (0, 0)


@dataclass
class ScriptedProvider:
    key: str
    scenarios: dict[str, list[Step]] = field(default_factory=lambda: {"demo": DEMO_SCENARIO})
    default: str = "demo"
    model: str = "scripted-coder"
    usage: Callable[[int], tuple[int, int]] = default_usage
    usage_for: Callable[[dict, int], tuple[int, int]] | None = None
    delay: float = 0.0
    seen: list[Seen] = field(default_factory=list)
    requests: list[tuple[str, str, bool]] = field(default_factory=list)  # (method, raw path, key present)
    most_at_once: int = 0
    address: str = "127.0.0.1"

    def __post_init__(self):
        provider = self

        class Handler(ScriptedHandler):
            owner = provider

        self._server = ThreadingHTTPServer((self.address, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self._at_once = 0

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def reported(self) -> tuple[int, int]:
        """(prompt, completion) tokens over every answered call."""
        return sum(seen.usage[0] for seen in self.seen), sum(seen.usage[1] for seen in self.seen)

    def _remember(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def _arrived(self, method: str, path: str, key_present: bool) -> None:
        with self._lock:
            self.requests.append((method, path, key_present))
            self._at_once += 1
            self.most_at_once = max(self.most_at_once, self._at_once)

    def _left(self) -> None:
        with self._lock:
            self._at_once -= 1


def _api_of(path: str) -> str | None:
    if path.endswith("/messages/count_tokens") or path.endswith(":countTokens"):
        return "count-tokens"
    if path.endswith("/chat/completions"):
        return "openai-completions"
    if path.endswith("/responses"):
        return "openai-responses"
    if path.endswith("/messages"):
        return "anthropic-messages"
    if ":streamGenerateContent" in path or ":generateContent" in path:
        return "google-generative-ai"
    return None


def _tool_results(api: str, body: dict) -> int:
    if api == "openai-completions":
        return sum(1 for message in body.get("messages", []) if message.get("role") == "tool")
    if api == "openai-responses":
        return sum(1 for item in body.get("input", []) if isinstance(item, dict)
                   and item.get("type") == "function_call_output")
    if api == "anthropic-messages":
        return sum(1 for message in body.get("messages", []) if isinstance(message.get("content"), list)
                   for block in message["content"] if isinstance(block, dict) and block.get("type") == "tool_result")
    return sum(1 for content in body.get("contents", []) for part in content.get("parts", [])
               if isinstance(part, dict) and "functionResponse" in part)


class ScriptedHandler(BaseHTTPRequestHandler):
    owner: ScriptedProvider
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body leave in separate writes: without this, Nagle and delayed ACKs add 40 ms a call.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._arrived_elsewhere()

    def do_DELETE(self):
        self._arrived_elsewhere()

    def _arrived_elsewhere(self):
        """Nothing but POST is answered; what arrived is remembered all the same."""
        self.owner._arrived(self.command, self.path, self._any_key_present())
        try:
            self._json(404, {"error": {"message": "no such endpoint"}})
        finally:
            self.owner._left()

    def _any_key_present(self) -> bool:
        key = self.owner.key
        return any(key in value for value in self.headers.values()) or key in self.path

    def do_POST(self):
        self.owner._arrived("POST", self.path, self._any_key_present())
        try:
            if self.owner.delay:
                time.sleep(self.owner.delay)
            self._post()
        finally:
            self.owner._left()

    def _post(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = urlsplit(self.path)
        api = _api_of(parts.path)
        if api is None:
            return self._json(404, {"error": {"message": "no such endpoint"}})
        text = raw.decode("utf-8", "replace")
        body = json.loads(text) if text.strip() else {}
        provider = self.owner
        if api == "count-tokens":
            counted = "google-generative-ai" if ":countTokens" in parts.path else "anthropic-messages"
            if not self._key_accepted(counted, parts.query):
                return self._error(counted, 401, "invalid key")
            prompt = provider.usage(_tool_results(counted, body))[0]
            return self._json(200, {"totalTokens": prompt} if counted == "google-generative-ai"
                              else {"input_tokens": prompt})
        match = MARKER.search(text)
        scenario = match.group(1) if match and match.group(1) in provider.scenarios else provider.default
        steps = provider.scenarios[scenario]
        step = _tool_results(api, body)
        seen = Seen(api=api, path=parts.path, headers={k.lower(): v for k, v in self.headers.items()}, body=text,
                    scenario=scenario, step=step, key_accepted=self._key_accepted(api, parts.query))
        provider._remember(seen)
        if not seen.key_accepted:
            seen.status = 401
            return self._error(api, 401, "invalid x-api-key" if api == "anthropic-messages" else "Incorrect API key")
        action = steps[min(step, len(steps) - 1)]
        if isinstance(action, Status):
            seen.status = action.code
            return self._error(api, action.code, f"scripted status {action.code}")
        seen.usage = provider.usage_for(body, len(raw)) if provider.usage_for else provider.usage(step)
        model = body.get("model") or (re.search(r"/models/([^/:]+):", parts.path) or [None, provider.model])[1]
        streaming = body.get("stream") is True or ":streamGenerateContent" in parts.path
        writer = {"openai-completions": _openai_completions, "openai-responses": _openai_responses,
                  "anthropic-messages": _anthropic, "google-generative-ai": _google}[api]
        events = writer(action, model, step, *seen.usage, streaming)
        if streaming:
            payload = b"".join(events)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        else:
            self._json(200, events)

    def _key_accepted(self, api: str, query: str) -> bool:
        key = self.owner.key
        if api == "anthropic-messages":
            return self.headers.get("x-api-key") == key
        if api == "google-generative-ai":
            return self.headers.get("x-goog-api-key") == key or parse_qs(query).get("key") == [key]
        return self.headers.get("Authorization") == f"Bearer {key}"

    def _error(self, api: str, status: int, message: str):
        if api == "anthropic-messages":
            kind = "authentication_error" if status == 401 else "api_error"
            return self._json(status, {"type": "error", "error": {"type": kind, "message": message}})
        if api == "google-generative-ai":
            return self._json(status, {"error": {"code": status, "message": message, "status": "UNAUTHENTICATED"}})
        return self._json(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def _json(self, status: int, document: dict):
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def _sse(document: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(document)}\n\n".encode()


def _openai_completions(action, model, step, prompt, completion, streaming):
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if isinstance(action, ToolCall):
        call = {"id": f"call_{step}", "type": "function",
                "function": {"name": action.name, "arguments": json.dumps(action.arguments)}}
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": action.text}, "stop"
    if not streaming:
        return {"id": f"chatcmpl-{step}", "object": "chat.completion", "model": model, "usage": usage,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]}

    def chunk(delta=None, finish_reason=None, usage=None):
        document = {"id": f"chatcmpl-{step}", "object": "chat.completion.chunk", "created": 1, "model": model,
                    "choices": [] if usage else [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}]}
        if usage:
            document["usage"] = usage
        return _sse(document)

    if isinstance(action, ToolCall):
        delta = {"role": "assistant", "tool_calls": [{"index": 0, **call}]}
    else:
        delta = {"role": "assistant", "content": action.text}
    return [chunk(delta), chunk(finish_reason=finish), chunk(usage=usage), b"data: [DONE]\n\n"]


def _openai_responses(action, model, step, prompt, completion, streaming):
    usage = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
             "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    if isinstance(action, ToolCall):
        item = {"type": "function_call", "id": f"fc_{step}", "call_id": f"call_{step}", "name": action.name,
                "arguments": json.dumps(action.arguments), "status": "completed"}
    else:
        item = {"type": "message", "id": f"msg_{step}", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": action.text, "annotations": []}]}
    response = {"id": f"resp_{step}", "object": "response", "model": model, "status": "completed",
                "output": [item], "usage": usage}
    if not streaming:
        return response
    started = {**item, "status": "in_progress"}
    if item["type"] == "function_call":
        started["arguments"] = ""
        middle = [_sse({"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": 0,
                        "delta": item["arguments"]}),
                  _sse({"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": 0,
                        "arguments": item["arguments"]})]
    else:
        started["content"] = []
        part = {"type": "output_text", "text": "", "annotations": []}
        middle = [_sse({"type": "response.content_part.added", "item_id": item["id"], "output_index": 0,
                        "content_index": 0, "part": part}),
                  _sse({"type": "response.output_text.delta", "item_id": item["id"], "output_index": 0,
                        "content_index": 0, "delta": action.text}),
                  _sse({"type": "response.output_text.done", "item_id": item["id"], "output_index": 0,
                        "content_index": 0, "text": action.text}),
                  _sse({"type": "response.content_part.done", "item_id": item["id"], "output_index": 0,
                        "content_index": 0, "part": {**part, "text": action.text}})]
    return [_sse({"type": "response.created", "response": {**response, "status": "in_progress", "output": [],
                                                            "usage": None}}),
            _sse({"type": "response.output_item.added", "output_index": 0, "item": started}),
            *middle,
            _sse({"type": "response.output_item.done", "output_index": 0, "item": item}),
            _sse({"type": "response.completed", "response": response})]


def _anthropic(action, model, step, prompt, completion, streaming):
    if isinstance(action, ToolCall):
        block = {"type": "tool_use", "id": f"toolu_{step}", "name": action.name, "input": action.arguments}
        stop = "tool_use"
    else:
        block, stop = {"type": "text", "text": action.text}, "end_turn"
    usage = {"input_tokens": prompt, "output_tokens": completion, "cache_read_input_tokens": 0,
             "cache_creation_input_tokens": 0}
    message = {"id": f"msg_{step}", "type": "message", "role": "assistant", "model": model, "stop_sequence": None}
    if not streaming:
        return {**message, "content": [block], "stop_reason": stop, "usage": usage}
    if block["type"] == "tool_use":
        opening = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(action.arguments)}
    else:
        opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": action.text}
    return [
        _sse({"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                   "usage": {**usage, "output_tokens": 1}}}, "message_start"),
        _sse({"type": "content_block_start", "index": 0, "content_block": opening}, "content_block_start"),
        _sse({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"),
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
              "usage": {"output_tokens": completion}}, "message_delta"),
        _sse({"type": "message_stop"}, "message_stop"),
    ]


def _google(action, model, step, prompt, completion, streaming):
    part = ({"functionCall": {"name": action.name, "args": action.arguments}} if isinstance(action, ToolCall)
            else {"text": action.text})
    document = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": completion,
                                  "totalTokenCount": prompt + completion},
                "modelVersion": model}
    return [_sse(document)] if streaming else document
