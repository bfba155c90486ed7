"""The egress gateway against the agent it guards: a prompt-injected container that tries to reach past its
model, spend unmetered, or pass its caps. Each test attacks the real gateway on its unix socket with the bytes a
hostile container would send, in front of a real local provider speaking each API's shape
(devtools/scripted_provider.py), and asserts what reached the provider and what the job was charged."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from apps.worker.gates import budget
from apps.worker.sandbox import gateway
from apps.worker.sandbox.providers import Upstream
from devtools.scripted_provider import ScriptedProvider
from tests.egress_support import PROVIDER_KEY, SHAPES, post, raw_exchange, running_gateway, upstream_for

SONNET = "claude-sonnet-4-5"  # $3 in, $15 out, $3.75 cache write per million tokens (pi's list)


@pytest.fixture
def provider():
    server = ScriptedProvider(key=PROVIDER_KEY)
    yield server
    server.close()


def anthropic_body(model=SONNET, **extra) -> bytes:
    return json.dumps({"model": model, "max_tokens": 256, "stream": True,
                       "messages": [{"role": "user", "content": "Fix the footer."}], **extra}).encode()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def sent_body(provider, index=0) -> dict:
    return json.loads(provider.seen[index].body)


# --- 1. only inference calls, exactly ---------------------------------------------------------------------

@pytest.mark.parametrize("target", [
    "/v1/../admin/keys", "/v1/%2e%2e/admin/keys", "/v1/..%2fadmin/keys", "/v1/%2E%2E/admin/keys",
    "/v1/messages/../../admin/keys", "/v1//messages", "/v1/./messages", "/v1/messages%2f", "/v1%2fmessages",
    "/v1/messages\\..\\..\\admin", "/v1/messages/batches", "/v1/files", "/v1/messages?beta=true", "/admin/keys",
    "/v1/messages/batches/../../messages", "http://api.anthropic.com/v1/messages",
])
def test_no_path_but_the_providers_own_calls_is_forwarded(target, provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        body = anthropic_body()
        answer = raw_exchange(egress.provider_socket,
                              f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    assert status_of(answer) in (400, 403)
    assert provider.requests == []  # nothing reached the provider, with the key or without
    assert not egress.report.meter.metered


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
def test_only_post_is_forwarded(method, provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("openai-responses", provider)) as (egress, _):
        answer = raw_exchange(egress.provider_socket, f"{method} /v1/responses HTTP/1.1\r\nHost: x\r\n"
                                                      "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
    assert status_of(answer) == 403 and provider.requests == []


def test_another_api_kinds_endpoint_is_not_forwarded_unmetered(provider, redis_conn):
    """With an openai-responses provider, chat completions were forwarded and metered as nothing."""
    body = json.dumps({"model": "gpt-5", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
    with running_gateway(redis_conn, upstream_for("openai-responses", provider)) as (egress, _):
        statuses = [post(egress.provider_socket, "/v1/chat/completions", body)[0] for _ in range(3)]
    assert statuses == [403, 403, 403] and provider.requests == []
    assert egress.report.refusals == {"egress-denied": 3}


def test_googles_model_is_the_checked_paths_and_a_traversal_is_refused(provider, redis_conn):
    upstream = upstream_for("google-generative-ai", provider)
    body = json.dumps({"contents": [{"role": "user", "parts": [{"text": "x"}]}]}).encode()
    with running_gateway(redis_conn, upstream) as (egress, _):
        tricked = raw_exchange(egress.provider_socket, (
            "POST /v1beta/models/gemini-2.5-flash:x/../gemini-2.5-pro:generateContent HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        encoded = raw_exchange(egress.provider_socket, (
            "POST /v1beta/models/gemini-2.5-flash%3Ax%2F..%2Fgemini-2.5-pro:generateContent HTTP/1.1\r\n"
            f"Host: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        honest, _ = post(egress.provider_socket, "/v1beta/models/gemini-2.5-pro:generateContent", body)
    assert status_of(tricked) == 403 and status_of(encoded) == 403
    assert honest == 200 and [seen.path for seen in provider.seen] == ["/v1beta/models/gemini-2.5-pro:generateContent"]
    (row,) = egress.report.meter.telemetry(turns=None).usage["models"]
    assert row["model"] == "gemini-2.5-pro"  # recorded as the model that was served


# --- 2. the body: parsed once, strictly, and what was parsed is what is forwarded ---------------------------

@pytest.mark.parametrize("raw", [
    b'{"model": "claude-haiku-4-5", "max_tokens": 256, "messages": [], "model": "claude-opus-4-1"}',
    b'{"model": "claude-haiku-4-5", "max_tokens": 256, "messages": [{"role": "user", "content": "a", "role": "x"}]}',
    b'{"model": "claude-haiku-4-5", "max_tokens": NaN, "messages": []}',
    b'[{"model": "claude-haiku-4-5"}]',
    b'{"model": "claude-haiku-4-5", "messages": [], "max_tokens": 256, "x": "\xff"}',
    b'{"max_tokens": 256, "messages": []}',
    b'{"model": 7, "max_tokens": 256, "messages": []}',
    b'[' * 100_000,
])
def test_a_body_read_two_ways_is_refused_and_stops_the_job(raw, provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, stops):
        status, answer = post(egress.provider_socket, "/v1/messages", raw)
        after, _ = post(egress.provider_socket, "/v1/messages", anthropic_body())
    assert status == 400 and b"request-malformed" in answer
    assert after == 403 and provider.requests == []
    assert stops == ["request-malformed"] and egress.report.stop_reason == "request-malformed"


def test_the_model_forwarded_is_the_model_metered(provider, redis_conn):
    """A nested `model` first, then the real one: the gateway reads the document, and forwards what it read."""
    body = (b'{"messages": [{"role": "user", "content": "x", "model": "claude-haiku-4-5"}], '
            b'"model": "claude-opus-4-1", "max_tokens": 256, "stream": true}')
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        status, _ = post(egress.provider_socket, "/v1/messages", body)
    assert status == 200 and sent_body(provider)["model"] == "claude-opus-4-1"
    (row,) = egress.report.meter.telemetry(turns=None).usage["models"]
    assert row["model"] == "claude-opus-4-1"


@pytest.mark.parametrize("api, body", [
    ("anthropic-messages", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
    ("anthropic-messages", {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
    ("anthropic-messages", {"mcp_servers": [{"type": "url", "url": "https://evil.example/mcp", "name": "x"}]}),
    ("anthropic-messages", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://evil.example/?secret=1"}}]}]}),
    ("anthropic-messages", {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "file", "file_id": "file_1"}}]}]}),
    ("anthropic-messages", {"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral",
                                                                                        "ttl": "1h"}}]}),
    ("openai-completions", {"n": 8}),
    ("openai-completions", {"web_search_options": {}}),
    ("openai-completions", {"tools": [{"type": "web_search"}]}),
    ("openai-completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://evil.example/?secret=1"}}]}]}),
    ("openai-completions", {"service_tier": "priority"}),
    ("openai-responses", {"previous_response_id": "resp_1"}),
    ("openai-responses", {"background": True}),
    ("openai-responses", {"tools": [{"type": "mcp", "server_url": "https://evil.example/mcp"}]}),
    ("openai-responses", {"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}),
    ("google-generative-ai", {"tools": [{"googleSearch": {}}]}),
    ("google-generative-ai", {"tools": [{"urlContext": {}}]}),
    ("google-generative-ai", {"cachedContent": "cachedContents/1"}),
    ("google-generative-ai", {"generationConfig": {"candidateCount": 8}}),
    ("google-generative-ai", {"contents": [{"role": "user", "parts": [
        {"fileData": {"fileUri": "https://evil.example/x", "mimeType": "text/plain"}}]}]}),
    ("google-generative-ai", {"contents": [{"role": "user", "parts": [
        {"inlineData": {"mimeType": "audio/mp3", "data": "AAAA"}}]}]}),
])
def test_provider_side_features_the_meter_cannot_bound_are_refused(api, body, provider, redis_conn):
    _, _, path, model = SHAPES[api]
    if api == "google-generative-ai":
        document = {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}
    elif api == "openai-responses":
        document = {"model": model, "max_output_tokens": 256, "input": "x"}
    else:
        document = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": "x"}]}
    document.update(body)
    with running_gateway(redis_conn, upstream_for(api, provider)) as (egress, _):
        status, answer = post(egress.provider_socket, path, json.dumps(document).encode())
    assert status == 403 and b"provider-feature-refused" in answer
    assert provider.requests == []


def test_only_the_headers_the_provider_needs_are_forwarded(provider, redis_conn):
    hostile = {"anthropic-beta": "context-1m-2025-08-07, files-api-2025-04-14, fine-grained-tool-streaming-2025-05-14",
               "x-api-key": gateway.PLACEHOLDER_KEY, "Authorization": "Bearer stolen", "OpenAI-Organization": "org",
               "X-Forwarded-For": "10.0.0.1", "anthropic-version": "2023-06-01"}
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        status, _ = post(egress.provider_socket, "/v1/messages", anthropic_body(), headers=hostile)
    headers = provider.seen[0].headers
    assert status == 200 and headers["anthropic-beta"] == "fine-grained-tool-streaming-2025-05-14"
    assert headers["x-api-key"] == PROVIDER_KEY and "authorization" not in headers
    assert not {"openai-organization", "x-forwarded-for"} & set(headers)
    assert headers["anthropic-version"] == "2023-06-01"


def test_a_streamed_completion_always_asks_for_its_usage(provider, redis_conn):
    """Any mention of include_usage used to skip the rewrite: a prompt quoting it, or asking for false."""
    body = json.dumps({"model": "scripted-coder", "stream": True, "stream_options": {"include_usage": False},
                       "messages": [{"role": "user", "content": 'say "include_usage"'}]}).encode()
    with running_gateway(redis_conn, upstream_for("openai-completions", provider)) as (egress, _):
        post(egress.provider_socket, "/v1/chat/completions", body)
    assert sent_body(provider)["stream_options"] == {"include_usage": True}
    assert egress.report.meter.tokens_total == sum(provider.reported())


# --- 3. no call can pass a cap ------------------------------------------------------------------------------

def answers_up_to_its_ceiling(body: dict, size: int) -> tuple[int, int]:
    """A provider that bills the whole request's bytes as prompt and answers as long as it is allowed to."""
    ceiling = body.get("max_tokens") or body.get("max_completion_tokens") or body.get("max_output_tokens") or 0
    return size, ceiling


def big_call(model=SONNET, output=50_000, size=40_000) -> bytes:
    return json.dumps({"model": model, "max_tokens": output, "stream": True,
                       "messages": [{"role": "user", "content": "x" * size}]}).encode()


def concurrently(count: int, call):
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: call(), range(count)))


def test_forty_calls_at_once_cannot_pass_the_token_budget(provider, redis_conn):
    """With a 100k budget, 40 concurrent 90k-token calls were all forwarded (4M tokens)."""
    provider.usage_for = answers_up_to_its_ceiling
    limits = gateway.Limits(max_tokens=100_000)
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        statuses = concurrently(40, lambda: post(egress.provider_socket, "/v1/messages", big_call())[0])
    assert egress.report.meter.tokens_total <= 100_000
    assert sum(provider.reported()) <= 100_000
    assert statuses.count(200) == len(provider.seen) >= 1
    assert stops == ["token-budget"]


def test_forty_calls_at_once_cannot_pass_the_dollar_cap(provider, redis_conn):
    provider.usage_for = answers_up_to_its_ceiling
    limits = gateway.Limits(max_cost_micros=500_000)  # $0.50
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        concurrently(40, lambda: post(egress.provider_socket, "/v1/messages", big_call(output=8_000))[0])
    cost = egress.report.meter.known_cost()
    assert cost is not None and Decimal("0.24") <= cost <= Decimal("0.50")  # at least one call, never past the cap
    prompt, completion = provider.reported()
    assert (Decimal(prompt) * 3 + Decimal(completion) * 15) / 1_000_000 <= Decimal("0.50")  # what the provider bills
    assert stops == ["cost-cap"]


def test_forty_calls_at_once_cannot_pass_the_days_tokens_across_jobs(provider, redis_conn):
    """Two jobs' gateways share the day's counter: their calls together stay under the day's cap."""
    provider.usage_for = answers_up_to_its_ceiling
    limits = gateway.Limits(daily_token_cap=300_000)
    upstream = upstream_for("anthropic-messages", provider)
    with running_gateway(redis_conn, upstream, limits=limits, job_id="day-a") as (first, _), \
            running_gateway(redis_conn, upstream, limits=limits, job_id="day-b") as (second, _):
        calls = [lambda: post(first.provider_socket, "/v1/messages", big_call()),
                 lambda: post(second.provider_socket, "/v1/messages", big_call())] * 20
        with ThreadPoolExecutor(40) as pool:
            list(pool.map(lambda call: call(), calls))
    assert sum(provider.reported()) <= 300_000
    assert budget.tokens_spent_today(redis_conn, timezone.now()) == sum(provider.reported())
    assert {first.report.stop_reason, second.report.stop_reason} <= {"daily-token-cap", None}


def test_the_output_ceiling_is_lowered_to_what_is_left_and_set_where_missing(provider, redis_conn):
    provider.usage_for = answers_up_to_its_ceiling
    limits = gateway.Limits(max_tokens=30_000)
    thinking = json.dumps({"model": SONNET, "max_tokens": 64_000, "stream": True,
                           "thinking": {"type": "enabled", "budget_tokens": 60_000},
                           "messages": [{"role": "user", "content": "x"}]}).encode()
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, _):
        post(egress.provider_socket, "/v1/messages", thinking)
    sent = sent_body(provider)
    assert 256 <= sent["max_tokens"] <= 30_000 - 4096
    assert 1024 <= sent["thinking"]["budget_tokens"] < sent["max_tokens"]

    bare = json.dumps({"model": "scripted-coder", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    with running_gateway(redis_conn, upstream_for("openai-completions", provider), limits=limits) as (egress, _):
        post(egress.provider_socket, "/v1/chat/completions", bare.encode())
    sent = sent_body(provider, 1)
    assert 256 <= sent["max_completion_tokens"] == sent["max_tokens"] <= 30_000 - 4096


@pytest.mark.parametrize("api", ["openai-responses", "google-generative-ai"])
def test_every_api_kind_gets_its_ceiling(api, provider, redis_conn):
    _, _, path, model = SHAPES[api]
    document = ({"contents": [{"role": "user", "parts": [{"text": "x"}]}],
                 "generationConfig": {"thinkingConfig": {"thinkingBudget": 90_000}}}
                if api == "google-generative-ai" else {"model": model, "input": "x", "stream": True})
    with running_gateway(redis_conn, upstream_for(api, provider), limits=gateway.Limits(max_tokens=20_000)) as (e, _):
        status, _ = post(e.provider_socket, path, json.dumps(document).encode())
    sent = sent_body(provider)
    if api == "google-generative-ai":
        ceiling = sent["generationConfig"]["maxOutputTokens"]
        assert sent["generationConfig"]["thinkingConfig"]["thinkingBudget"] <= ceiling
    else:
        ceiling = sent["max_output_tokens"]
    assert status == 200 and 256 <= ceiling <= 20_000 - 4096


def test_a_model_without_a_price_is_refused_under_a_dollar_cap(provider, redis_conn):
    """500k tokens of an unlisted model passed a $0.50 cap, counted as $0."""
    limits = gateway.Limits(max_cost_micros=500_000)
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        status, answer = post(egress.provider_socket, "/v1/messages", anthropic_body(model="claude-mystery-9"))
    assert status == 403 and b"model-unpriced" in answer and provider.requests == []
    assert stops == ["model-unpriced"] and egress.report.unpriced_model == "unlisted"

    custom = Upstream("acme", "openai-completions", provider.url + "/v1", builtin=False)
    body = json.dumps({"model": "acme-coder", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    with running_gateway(redis_conn, custom, limits=gateway.Limits(max_cost_micros=500_000, model="acme-coder")) \
            as (egress, stops):
        status, _ = post(egress.provider_socket, "/v1/chat/completions", body.encode())
    assert status == 403 and egress.report.unpriced_model == "acme-coder"  # the operator's own model: named


def test_a_model_the_operator_prices_runs_under_a_dollar_cap(provider, redis_conn, settings, tmp_path):
    from apps.worker.sandbox import prices

    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"acme/acme-coder": {"input": 1, "output": 2}}))
    settings.PI_MODEL_PRICES = str(table)
    prices._operator_prices.cache_clear()
    custom = Upstream("acme", "openai-completions", provider.url + "/v1", builtin=False)
    body = json.dumps({"model": "acme-coder", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    try:
        with running_gateway(redis_conn, custom, limits=gateway.Limits(max_cost_micros=500_000)) as (egress, _):
            status, _ = post(egress.provider_socket, "/v1/chat/completions", body.encode())
    finally:
        prices._operator_prices.cache_clear()
    assert status == 200 and egress.report.meter.known_cost() == Decimal("0.001360")  # 1200 in, 80 out


class LyingProvider:
    """An upstream that answers 200 without saying what the call used, or cuts its answer short."""

    def __init__(self, mode: str):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.calls += 1
                if mode == "no-usage":
                    payload = b'{"id": "msg_1", "type": "message", "content": []}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                else:  # cut: promise a long body, send a little, hang up
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    self.wfile.write(b'{"id": "msg_1"')
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)

        self.calls = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["no-usage", "cut"])
def test_an_answer_whose_usage_cannot_be_read_is_charged_its_worst_case(mode, redis_conn):
    liar = LyingProvider(mode)
    upstream = Upstream("anthropic", "anthropic-messages", liar.url, builtin=True)
    body = json.dumps({"model": SONNET, "max_tokens": 2000, "messages": [{"role": "user", "content": "x"}]}).encode()
    try:
        with running_gateway(redis_conn, upstream, limits=gateway.Limits(max_tokens=50_000)) as (egress, stops):
            try:
                post(egress.provider_socket, "/v1/messages", body)
            except http.client.HTTPException:
                assert mode == "cut"  # the container sees the answer cut short, as the provider cut it
    finally:
        liar.close()
    meter = egress.report.meter
    assert liar.calls == 1 and meter.worst_cases == 1
    assert meter.tokens_total >= len(body) + 2000  # the input bound and the whole output ceiling
    assert meter.known_cost() is not None and meter.known_cost() > Decimal("0.03")
    assert budget.tokens_spent_today(redis_conn, timezone.now()) == meter.tokens_total
    assert stops == (["usage-unreadable"] if mode == "no-usage" else [])


# --- 4. the gateway's own bounds ---------------------------------------------------------------------------

def test_a_jobs_calls_in_flight_are_bounded(provider, redis_conn, settings):
    settings.PI_GATEWAY_CALLS_IN_FLIGHT = 2
    provider.delay = 0.3
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        statuses = concurrently(6, lambda: post(egress.provider_socket, "/v1/messages", anthropic_body())[0])
        assert statuses == [200] * 6 and provider.most_at_once == 2  # the others waited their turn

    settings.PI_GATEWAY_CALLS_IN_FLIGHT = 1
    provider.most_at_once = 0
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        statuses = concurrently(30, lambda: post(egress.provider_socket, "/v1/messages", anthropic_body())[0])
    assert statuses.count(429) >= 30 - 1 - gateway.MAX_WAITING_CALLS  # past the waiting line: refused at once
    assert provider.most_at_once == 1


def test_a_body_past_the_limit_is_refused_before_it_is_read_whole(provider, redis_conn, settings):
    settings.PI_GATEWAY_MAX_REQUEST_MB = 1
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        declared = raw_exchange(egress.provider_socket, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n"
                                                        b"Content-Length: 61000000\r\nConnection: close\r\n\r\n{")
        chunk = b"x" * 65536
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n"
        streamed = raw_exchange(egress.provider_socket, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n"
                                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)
    assert status_of(declared) == 413 and status_of(streamed) == 413 and provider.requests == []


# The gateway alone in a process of its own (the provider stays in the test's), so its peak memory is its own.
MEMORY_PROBE = """
import os, sys, django
django.setup()
import redis
from apps.worker.sandbox.providers import Upstream
from tests.egress_support import running_gateway
upstream = Upstream("anthropic", "anthropic-messages", os.environ["PROBE_PROVIDER_URL"], builtin=True)
with running_gateway(redis.Redis.from_url(os.environ["REDIS_URL"]), upstream, job_id="memory-probe") as (egress, _):
    print(egress.provider_socket, flush=True)
    sys.stdin.read()
"""


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_the_gateways_memory_is_bounded_whatever_the_container_sends(provider, redis_conn):
    """Six concurrent 60 MiB bodies took the work horse to 2.35 GB. Now: bodies past PI_GATEWAY_MAX_REQUEST_MB are
    refused as they stream in, a body of too many JSON values before it is parsed, and the worst bodies under
    both (half a million tiny objects; 7 MiB of text) wait for one of the job's few places in flight."""
    probe = subprocess.Popen([sys.executable, "-c", MEMORY_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "DJANGO_SETTINGS_MODULE": "pidispatch_site.settings",
                                             "PROBE_PROVIDER_URL": provider.url})
    try:
        socket_path = probe.stdout.readline().strip()
        baseline = peak_rss_mb(probe.pid)
        huge = b"x" * (60 * 1024 * 1024)
        # The densest JSON the gateway parses: just under its count of values, in a few MiB.
        objects = b'{"model": "claude-sonnet-4-5", "max_tokens": 256, "messages": [' + b"{}," * 249_990 + b'{}]}'
        text = json.dumps({"model": SONNET, "max_tokens": 256, "messages": [
            {"role": "user", "content": "x" * (7 * 1024 * 1024)}]}).encode()  # the largest body it reads

        def send(body):
            try:
                return post(socket_path, "/v1/messages", body)[0]
            except OSError:
                return "reset"  # refused before its body was read whole

        started = time.monotonic()
        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(send, [huge] * 4 + [objects] * 4 + [text] * 4))
        peak = peak_rss_mb(probe.pid)
    finally:
        probe.stdin.close()
        probe.wait(30)
    print(f"gateway grew {peak - baseline:.0f} MB in {time.monotonic() - started:.1f} s: {results}")
    assert set(results[:4]) <= {413, "reset"} and results[4:] == [200] * 8
    assert peak - baseline < 200, f"the gateway grew {peak - baseline:.0f} MB"


@pytest.mark.parametrize("ceilings", [{"max_tokens": 300, "max_completion_tokens": 900_000},
                                      {"max_completion_tokens": 1e6}, {"max_tokens": "900000"}])
def test_a_ceiling_read_two_ways_is_written_again(ceilings, provider, redis_conn):
    """Two fields that disagree, or a ceiling that is not an integer: the provider might read either, so the
    gateway writes its own into every field."""
    body = json.dumps({"model": "scripted-coder", "stream": True, "messages": [{"role": "user", "content": "x"}],
                       **ceilings}).encode()
    limits = gateway.Limits(max_tokens=20_000)
    with running_gateway(redis_conn, upstream_for("openai-completions", provider), limits=limits) as (egress, _):
        post(egress.provider_socket, "/v1/chat/completions", body)
    sent = sent_body(provider)
    written = {sent[field] for field in ceilings}
    assert len(written) == 1 and 256 <= written.pop() <= 20_000 - 4096
