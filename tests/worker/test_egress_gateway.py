"""The egress gateway's provider side: every provider shape pi speaks is forwarded with the real key, metered
from the provider's own answer (streamed or not), priced, and cut at the job's budgets. Real sockets, a real
local provider speaking each shape (devtools/scripted_provider.py), real Redis for the day's token counter."""

import json
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.worker.gates import budget
from apps.worker.sandbox import gateway, metering
from apps.worker.sandbox.providers import Upstream
from devtools.scripted_provider import ScriptedProvider, Text, ToolCall
from tests.egress_support import PROVIDER_KEY, SHAPES, post, running_gateway, upstream_for


@pytest.fixture
def provider():
    server = ScriptedProvider(key=PROVIDER_KEY)
    yield server
    server.close()


def request_body(api: str, model: str, stream: bool) -> bytes:
    prompt = "Fix the footer."
    if api == "anthropic-messages":
        body = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": prompt}]}
    elif api == "openai-completions":
        body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif api == "openai-responses":
        body = {"model": model, "input": [{"role": "user", "content": prompt}]}
    else:
        body = {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
    if api != "google-generative-ai":
        body["stream"] = stream
    return json.dumps(body).encode()


def path_for(api: str, stream: bool) -> str:
    path = SHAPES[api][2]
    if api == "google-generative-ai":
        return path + "?alt=sse" if stream else path.replace(":streamGenerateContent", ":generateContent")
    return path


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "one-body"])
@pytest.mark.parametrize("api", list(SHAPES))
def test_each_provider_shape_is_forwarded_with_the_key_and_metered(api, stream, provider, redis_conn):
    model = SHAPES[api][3]
    with running_gateway(redis_conn, upstream_for(api, provider), limits=gateway.Limits(model=model)) as (egress, _):
        status, answer = post(egress.provider_socket, path_for(api, stream), request_body(api, model, stream),
                              headers={"Authorization": f"Bearer {gateway.PLACEHOLDER_KEY}",
                                       "x-api-key": gateway.PLACEHOLDER_KEY})
    assert status == 200, answer
    (seen,) = provider.seen
    assert seen.key_accepted  # the real key, added on the way out
    assert gateway.PLACEHOLDER_KEY not in json.dumps(seen.headers)
    assert (b"data:" in answer) == stream  # the answer passes through in its own framing

    prompt, completion = provider.reported()
    telemetry = egress.report.meter.telemetry(turns=None)
    assert (telemetry.tokens_in, telemetry.tokens_out, telemetry.tokens_total) == (prompt, completion,
                                                                                   prompt + completion)
    (row,) = telemetry.usage["models"]
    assert (row["provider"], row["model"], row["calls"]) == (upstream_for(api, provider).provider, model, 1)
    assert telemetry.usage["source"] == "gateway"
    # The gateway counted the call into the day's token counter as it went.
    assert budget.tokens_spent_today(redis_conn, timezone.now()) == prompt + completion


def test_cost_is_pis_own_list_price(provider, redis_conn):
    """claude-sonnet-4-5 at $3/$15 per million: 1200 in and 80 out cost $0.0048, as pi itself computes."""
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        post(egress.provider_socket, "/v1/messages", request_body("anthropic-messages", "claude-sonnet-4-5", True))
    assert egress.report.meter.telemetry(turns=None).cost == Decimal("0.004800")


def test_each_priced_row_names_the_date_of_its_price_table(provider, redis_conn, settings, tmp_path):
    from apps.worker.sandbox import prices, providers

    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        post(egress.provider_socket, "/v1/messages", request_body("anthropic-messages", "claude-sonnet-4-5", True))
    (row,) = egress.report.meter.telemetry(turns=None).usage["models"]
    assert row["priceDate"] == providers.registry()["generated"]  # pi's list, as of the pinned pi

    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"date": "2026-11-30", "anthropic/claude-sonnet-4-5": {"input": 1, "output": 2}}))
    settings.PI_MODEL_PRICES = str(table)
    assert prices.price_date("anthropic", "claude-sonnet-4-5") == "2026-11-30"
    assert prices.cost("anthropic", "claude-sonnet-4-5", metering.Usage(input=1_000_000, output=1_000_000)) == 3
    table.write_text(json.dumps({"date": "30 Nov"}))
    prices._operator_prices.cache_clear()
    with pytest.raises(Exception, match="date must be YYYY-MM-DD"):
        prices.price("anthropic", "claude-sonnet-4-5")
    prices._operator_prices.cache_clear()
    prices._operator_date.cache_clear()


def test_an_unpriced_model_has_no_cost_rather_than_zero(provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("openai-completions", provider),
                         limits=gateway.Limits(model="scripted-coder")) as (egress, _):
        post(egress.provider_socket, "/v1/chat/completions",
             request_body("openai-completions", "scripted-coder", True))
    telemetry = egress.report.meter.telemetry(turns=None)
    assert telemetry.tokens_total == sum(provider.reported()) and telemetry.cost is None
    assert telemetry.usage["models"][0]["model"] == "scripted-coder"


def test_a_model_name_the_container_made_up_never_reaches_the_record(provider, redis_conn):
    invented = "please-fix-the-checkout-button"
    with running_gateway(redis_conn, upstream_for("openai-completions", provider)) as (egress, _):
        post(egress.provider_socket, "/v1/chat/completions", request_body("openai-completions", invented, True))
    assert egress.report.meter.telemetry(turns=None).usage["models"][0]["model"] == "unlisted"


def test_a_streamed_completion_without_usage_asked_gets_it_asked(provider, redis_conn):
    body = json.dumps({"model": "scripted-coder", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    with running_gateway(redis_conn, upstream_for("openai-completions", provider)) as (egress, _):
        status, _ = post(egress.provider_socket, "/v1/chat/completions", body.encode())
    assert status == 200
    assert json.loads(provider.seen[0].body)["stream_options"] == {"include_usage": True}
    assert egress.report.meter.tokens_total == sum(provider.reported())


def test_only_the_providers_own_paths_are_forwarded(provider, redis_conn):
    upstream = Upstream("acme", "openai-completions", provider.url + "/v1", builtin=False)
    with running_gateway(redis_conn, upstream) as (egress, _):
        status, answer = post(egress.provider_socket, "/admin/chat/completions", b"{}")
    assert status == 403 and b"egress-denied" in answer
    assert provider.requests == []


# The budgets below are sized on the gateway's worst case for these small requests: about 4,300 tokens of input
# bound (the body's bytes and the provider's template) plus the 256 tokens of output they ask for.

def test_the_token_budget_stops_forwarding_and_stops_the_job(provider, redis_conn):
    provider.scenarios["long"] = [ToolCall("bash", {"command": "true"})] * 5 + [Text("done")]
    limits = gateway.Limits(max_tokens=5200)
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        body = request_body("anthropic-messages", "claude-sonnet-4-5", True)
        body = body.replace(b"footer.", b"footer. scripted:long")
        first, _ = post(egress.provider_socket, "/v1/messages", body)
        second, refusal = post(egress.provider_socket, "/v1/messages", body)
    assert first == 200 and second == 403 and b"token-budget" in refusal
    assert len(provider.seen) == 1  # the call past the budget never left the host
    assert egress.report.stop_reason == "token-budget" and stops == ["token-budget"]


def test_the_dollar_cap_stops_forwarding_and_stops_the_job(provider, redis_conn):
    """claude-sonnet-4-5's first answer costs $0.0048, its worst case about $0.02 (input at the cache-write rate):
    a $0.022 cap forwards the first call, and no second one fits beside what the first spent."""
    provider.scenarios["long"] = [ToolCall("bash", {"command": "true"})] * 5 + [Text("done")]
    limits = gateway.Limits(max_cost_micros=22_000)
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        body = request_body("anthropic-messages", "claude-sonnet-4-5", True)
        body = body.replace(b"footer.", b"footer. scripted:long")
        first, _ = post(egress.provider_socket, "/v1/messages", body)
        second, refusal = post(egress.provider_socket, "/v1/messages", body)
    assert first == 200 and second == 403 and b"cost-cap" in refusal
    assert len(provider.seen) == 1 and stops == ["cost-cap"]
    assert egress.report.meter.known_cost() == Decimal("0.0048")  # what the windows are charged


def test_an_unpriced_answer_leaves_the_cost_unknown(provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("openai-completions", provider),
                         limits=gateway.Limits(model="scripted-coder")) as (egress, _):
        post(egress.provider_socket, "/v1/chat/completions", request_body("openai-completions", "scripted-coder", True))
    assert egress.report.meter.metered and egress.report.meter.known_cost() is None
    assert metering.Meter().known_cost() is None  # nothing metered: nothing known either


def test_the_days_token_cap_stops_a_running_job(provider, redis_conn):
    budget.record_tokens(redis_conn, 9_000, timezone.now())  # other jobs spent most of the day's tokens
    limits = gateway.Limits(daily_token_cap=14_000)
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        body = request_body("anthropic-messages", "claude-sonnet-4-5", True)
        first, _ = post(egress.provider_socket, "/v1/messages", body)  # used 1,280: the next worst case won't fit
        second, _ = post(egress.provider_socket, "/v1/messages", body)
    assert (first, second) == (200, 403) and stops == ["daily-token-cap"]
    assert budget.tokens_spent_today(redis_conn, timezone.now()) == 9_000 + sum(provider.reported())


def test_a_job_held_to_its_model_cannot_switch_to_another(provider, redis_conn):
    limits = gateway.Limits(model="claude-haiku-4-5")
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), limits=limits) as (egress, stops):
        status, _ = post(egress.provider_socket, "/v1/messages",
                         request_body("anthropic-messages", "claude-opus-4-1", True))
    assert status == 403 and stops == ["model-not-allowed"] and provider.seen == []


def test_a_provider_that_cannot_be_reached_is_a_fault_not_a_hang(redis_conn):
    upstream = Upstream("anthropic", "anthropic-messages", "http://127.0.0.1:9", builtin=True)
    with running_gateway(redis_conn, upstream) as (egress, _):
        status, _ = post(egress.provider_socket, "/v1/messages",
                         request_body("anthropic-messages", "claude-sonnet-4-5", True))
    assert status == 502 and egress.report.faults == 1 and not egress.report.meter.metered


def test_a_refused_key_is_seen(provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider), key="sk-wrong") as (egress, _):
        status, _ = post(egress.provider_socket, "/v1/messages",
                         request_body("anthropic-messages", "claude-sonnet-4-5", True))
    assert status == 401 and egress.report.auth_refused == 1


def test_the_sockets_are_the_job_users_only_and_go_away(provider, redis_conn):
    with running_gateway(redis_conn, upstream_for("anthropic-messages", provider)) as (egress, _):
        for path in (egress.provider_socket, egress.proxy_socket):
            info = path.stat()
            assert (info.st_uid, info.st_mode & 0o777) == (1000, 0o600)
        assert egress.folder.stat().st_mode & 0o777 == 0o700
    assert not egress.folder.exists()


@pytest.mark.parametrize("events, expected", [
    # Anthropic: message_start carries the prompt, message_delta the cumulative output (and, lately, more).
    ([{"type": "message_start", "message": {"usage": {"input_tokens": 10, "output_tokens": 1,
                                                      "cache_read_input_tokens": 500,
                                                      "cache_creation_input_tokens": 40}}},
      {"type": "message_delta", "usage": {"output_tokens": 7}},
      {"type": "message_delta", "usage": {"output_tokens": 30, "input_tokens": 12}}],
     metering.Usage(input=12, output=30, cache_read=500, cache_write=40)),
])
def test_anthropic_usage_is_read_as_pi_reads_it(events, expected):
    reader = metering.ResponseReader("anthropic-messages", streaming=True)
    for event in events:
        reader.feed(f"event: x\ndata: {json.dumps(event)}\n\n".encode())
    assert reader.finish() == expected


def test_openai_cached_prompt_tokens_are_split_out_as_pi_does():
    usage = metering.read_usage("openai-completions", {"usage": {
        "prompt_tokens": 1000, "completion_tokens": 50, "prompt_tokens_details": {"cached_tokens": 600}}}, None)
    assert usage == metering.Usage(input=400, output=50, cache_read=600)
    responses = metering.read_usage("openai-responses", {"type": "response.completed", "response": {"usage": {
        "input_tokens": 1000, "output_tokens": 50, "input_tokens_details": {"cached_tokens": 600}}}}, None)
    assert responses == metering.Usage(input=400, output=50, cache_read=600)


def test_a_stream_split_anywhere_is_read_the_same():
    stream = (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":321,"completion_tokens":12}}\n\ndata: [DONE]\n\n')
    for size in (1, 3, 7, len(stream)):
        reader = metering.ResponseReader("openai-completions", streaming=True)
        for start in range(0, len(stream), size):
            reader.feed(stream[start:start + size])
        assert reader.finish() == metering.Usage(input=321, output=12)
