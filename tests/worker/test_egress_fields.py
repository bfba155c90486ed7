"""Only the fields each provider knows leave the host (issue 47 §1): the real gateway on its unix socket, in front of
a real local provider speaking each API's shape, refuses a request carrying a field its API shape (on its upstream)
is not known to take, and forwards what pi itself sends. An allow list: a field nobody has seen yet is refused too."""

from __future__ import annotations

import json

import pytest

from apps.worker.sandbox import provider_calls
from devtools.scripted_provider import ScriptedProvider
from tests.egress_support import PROVIDER_KEY, SHAPES, post, running_gateway, upstream_for


@pytest.fixture
def provider():
    server = ScriptedProvider(key=PROVIDER_KEY)
    yield server
    server.close()


def document_for(api: str, **fields) -> dict:
    """A request of the API's own shape, as pi sends it, with `fields` over it."""
    _, _, _, model = SHAPES[api]
    if api == "google-generative-ai":
        base = {"contents": [{"role": "user", "parts": [{"text": "Fix the footer."}]}],
                "generationConfig": {"maxOutputTokens": 256}}
    elif api == "openai-responses":
        base = {"model": model, "input": [{"role": "user", "content": "Fix the footer."}], "stream": True,
                "store": False, "max_output_tokens": 256}
    else:
        base = {"model": model, "max_tokens": 256, "stream": True,
                "messages": [{"role": "user", "content": "Fix the footer."}]}
    return {**base, **fields}


def call(egress, api: str, document: dict) -> tuple[int, bytes]:
    return post(egress.provider_socket, SHAPES[api][2], json.dumps(document).encode())


@pytest.mark.parametrize("api, fields", [
    # A fallback list routes past the model pin, metered at the pinned model's price (OpenRouter's `models`).
    ("openai-completions", {"models": ["anthropic/claude-opus-4.1", "openai/gpt-5"]}),
    ("openai-completions", {"plugins": [{"id": "web", "max_results": 5}]}),  # OpenRouter's web search
    ("openai-completions", {"search_parameters": {"mode": "on"}}),  # xAI's live search
    # Routing preferences only reach the upstream that reads them: never OpenRouter's or Vercel's elsewhere.
    ("openai-completions", {"provider": {"order": ["openai"]}}),
    ("openai-completions", {"providerOptions": {"gateway": {"models": ["openai/gpt-5"]}}}),
    ("openai-completions", {"stream_options": {"include_usage": True, "include_obfuscation": True}}),
    ("openai-completions", {"user": "someone@example.com"}),
    ("openai-responses", {"include": ["file_search_call.results"]}),
    ("openai-responses", {"reasoning": {"effort": "high", "generate_summary": "detailed"}}),
    ("openai-responses", {"truncation": "auto"}),
    ("anthropic-messages", {"context_management": {"edits": []}}),
    ("anthropic-messages", {"thinking": {"type": "enabled", "budget_tokens": 2048, "allow_longer": True}}),
    # Google's JSON mapping reads snake_case too: a second spelling of what the gateway bounds.
    ("google-generative-ai", {"generationConfig": {"maxOutputTokens": 256, "thinkingConfig": {
        "thinking_budget": 1_000_000}}}),
    ("google-generative-ai", {"generationConfig": {"maxOutputTokens": 256, "responseModalities": ["AUDIO"]}}),
    ("google-generative-ai", {"generationConfig": {"maxOutputTokens": 256, "speechConfig": {}}}),
    ("google-generative-ai", {"labels": {"team": "x"}}),
    ("google-generative-ai", {"generation_config": {"max_output_tokens": 1_000_000}}),
])
def test_a_field_the_api_shape_is_not_known_to_take_is_refused_and_never_forwarded(api, fields, provider,
                                                                                    redis_conn):
    with running_gateway(redis_conn, upstream_for(api, provider)) as (egress, _):
        status, answer = call(egress, api, document_for(api, **fields))
    assert status == 403 and b"provider-field-refused" in answer
    assert provider.requests == []
    assert egress.report.refusals == {"provider-field-refused": 1}  # what the run records


@pytest.mark.parametrize("api, fields", [
    ("anthropic-messages", {"system": [{"type": "text", "text": "Be brief."}], "temperature": 0.2,
                            "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "summarized"},
                            "tool_choice": {"type": "auto"}, "metadata": {"user_id": "session-1"}}),
    ("openai-completions", {"stream_options": {"include_usage": True}, "store": False, "max_completion_tokens": 256,
                            "reasoning_effort": "low", "prompt_cache_key": "session-1", "tool_choice": "auto"}),
    ("openai-responses", {"reasoning": {"effort": "low", "summary": "auto"},
                          "include": ["reasoning.encrypted_content"], "prompt_cache_key": "session-1"}),
    ("google-generative-ai", {"generationConfig": {"maxOutputTokens": 256, "temperature": 0.2, "thinkingConfig": {
        "includeThoughts": True, "thinkingBudget": 128}}, "systemInstruction": {"parts": [{"text": "Be brief."}]}}),
])
def test_what_pi_sends_is_forwarded(api, fields, provider, redis_conn):
    with running_gateway(redis_conn, upstream_for(api, provider)) as (egress, _):
        status, _ = call(egress, api, document_for(api, **fields))
    assert status == 200 and len(provider.requests) == 1
    assert egress.report.refusals == {}


# A unit test beside the integration ones above: the upstream-specific fields need the upstream's own host name,
# which no test here can serve (only loopback is a test's target).
@pytest.mark.parametrize("host, fields, unknown", [
    ("openrouter.ai", {"provider": {"only": ["anthropic"]}, "reasoning": {"effort": "high"}}, False),
    ("openrouter.ai", {"provider": {"only": ["anthropic"], "models": ["x"]}}, True),
    ("openrouter.ai", {"models": ["openai/gpt-5"]}, True),
    ("ai-gateway.vercel.sh", {"providerOptions": {"gateway": {"order": ["bedrock"], "only": ["bedrock"]}}}, False),
    ("ai-gateway.vercel.sh", {"providerOptions": {"gateway": {"models": ["openai/gpt-5"]}}}, True),
    ("ai-gateway.vercel.sh", {"providerOptions": {"gateway": {}, "openai": {}}}, True),
    ("ai-gateway.vercel.sh", {"provider": {"only": ["anthropic"]}}, True),
    ("evil-openrouter.ai", {"provider": {"only": ["anthropic"]}}, True),
    ("api.x.ai", {"search_parameters": {"mode": "on"}}, True),
])
def test_routing_preferences_pass_only_to_the_upstream_that_reads_them(host, fields, unknown):
    document = document_for("openai-completions", **fields)
    forwarded = provider_calls.Call("openai-completions", True, "/chat/completions")
    assert provider_calls.unknown_field(forwarded, document, host) is unknown
