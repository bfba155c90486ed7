"""The provider calls a job's egress gateway forwards: an explicit table per API kind, each call's path, body,
model and output ceiling checked and rewritten before anything leaves the host.

Deny by default. The container holds no key, so the gateway is the only way its requests reach the provider
with one; a call not in the table (a batch, a file upload, a fine-tune, an admin path, another API kind's
endpoint) is answered 403 `egress-denied` and never forwarded. What pi 0.73.1 calls (pi-ai's providers):

    anthropic-messages    POST /v1/messages (streamed); POST /v1/messages/count_tokens is free and forwarded too
    openai-completions    POST /chat/completions
    openai-responses      POST /responses
    google-generative-ai  POST /models/<model>:streamGenerateContent?alt=sse (and :generateContent,
                          :countTokens)

each under the provider's base path (`https://api.openai.com/v1` -> `/v1/chat/completions`).

The path is checked as the container sent it, before any decoding: only unreserved characters, no `.` or `..`
segment, no empty segment, no percent-encoding at all (so no encoded slash, dot or backslash), no query but the
one a call declares. The URL sent upstream is rebuilt from the table's own path, never from the request's.

The body is parsed once, strictly (UTF-8, one JSON object, no duplicate key at any depth, no NaN, no comment or
trailing comma), and what is forwarded is that document: serialised again when the gateway rewrote it (its output
ceiling, its usage request), else the bytes it parsed, which then hold no construct two JSON parsers read apart,
so no parser upstream can read another model or another ceiling than the gateway did. The model is the document's
(Google: the checked path's). Only the fields each API shape is known to take for inference pass, at the top level
and inside the objects that steer routing, thinking or output (an allow list: what pi-ai 0.73.1's providers send
and the provider documents; a few routing fields only to the one upstream that reads them): any other field is
refused `provider-field-refused`, since an unknown one may route to another model than the one priced (`models`,
`providerOptions.gateway.models`), switch on a provider-side tool (`plugins`, `search_parameters`) or spell a field
the gateway rewrote a second way (Google's snake_case). Features the meter cannot bound are refused
(`provider-feature-refused`): provider-side tools (web search, code execution, remote MCP servers, URL fetches),
references to content stored at the provider (files, cached contents, earlier responses), several answers per
call, priority tiers, and media the gateway cannot bound (documents, audio, video). Images travel inline only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

ANTHROPIC, COMPLETIONS, RESPONSES, GOOGLE = ("anthropic-messages", "openai-completions", "openai-responses",
                                             "google-generative-ai")

# The tokens an input can cost beyond its bytes: the provider's own template (Anthropic adds a few hundred
# tokens of tool-use prompt that is not in the body) and each inline image (a tile count, not its bytes).
TEMPLATE_TOKENS = 4096
MEDIA_TOKENS = 32_768
# Google's image types; everything else inline (audio, video, PDF) is billed by length, not bytes.
GOOGLE_INLINE_TYPES = re.compile(r"^image/(png|jpeg|webp|heic|heif|gif)$")

# A request pi sends holds a few thousand JSON values; a hostile one may hold millions in a few MiB.
MAX_JSON_VALUES = 500_000
JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')

SAFE_PATH = re.compile(r"^/[A-Za-z0-9._~:/-]*$")
GOOGLE_CALL = re.compile(r"^/models/([a-z0-9][a-z0-9.-]{0,99}):(generateContent|streamGenerateContent|countTokens)$")
MODEL_NAME = re.compile(r"^[\x21-\x7e]{1,200}$")
GOOGLE_REQUEST_FIELDS = frozenset({"contents", "systemInstruction", "tools", "toolConfig", "generationConfig",
                                   "safetySettings", "model"})
GOOGLE_GENERATION_FIELDS = frozenset({"temperature", "topP", "topK", "maxOutputTokens", "stopSequences",
                                      "candidateCount", "seed", "thinkingConfig", "responseModalities"})
GOOGLE_THINKING_FIELDS = frozenset({"thinkingBudget", "includeThoughts", "thinkingLevel"})

# The top-level fields each API shape's billed call may carry: what pi-ai's buildParams writes, and the
# provider's documented inference parameters beside them (sampling, stops, tool choice).
REQUEST_FIELDS = {
    ANTHROPIC: frozenset({"model", "messages", "max_tokens", "stream", "system", "temperature", "top_p", "top_k",
                          "stop_sequences", "tools", "tool_choice", "thinking", "output_config", "metadata"}),
    COMPLETIONS: frozenset({"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                            "temperature", "top_p", "stop", "seed", "tools", "tool_choice", "parallel_tool_calls",
                            "tool_stream", "prompt_cache_key", "prompt_cache_retention", "store", "reasoning_effort",
                            "enable_thinking", "chat_template_kwargs", "thinking", "n", "modalities",
                            "service_tier"}),
    RESPONSES: frozenset({"model", "input", "instructions", "stream", "max_output_tokens", "temperature", "top_p",
                          "tools", "tool_choice", "parallel_tool_calls", "prompt_cache_key", "prompt_cache_retention",
                          "store", "reasoning", "include", "service_tier"}),
}
# Anthropic's free token count takes the request's content only.
COUNT_TOKENS_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
# Routing preferences pi sends to the one upstream that reads them (pi-ai keys them on the base URL's host too).
HOST_FIELDS = {"openrouter.ai": {COMPLETIONS: frozenset({"provider", "reasoning"})},
               "ai-gateway.vercel.sh": {COMPLETIONS: frozenset({"providerOptions"})}}
# Inside the objects that steer a call, the same: only the keys known (a value that is not an object is the
# provider's to refuse).
NESTED_FIELDS = {
    ANTHROPIC: {"thinking": {"type", "budget_tokens", "display"}, "output_config": {"effort"},
                "metadata": {"user_id"}},
    COMPLETIONS: {"stream_options": {"include_usage"}, "chat_template_kwargs": {"enable_thinking", "preserve_thinking"},
                  "thinking": {"type"}, "reasoning": {"effort"},
                  # OpenRouter's provider routing: among the providers serving the one model asked for.
                  "provider": {"order", "only", "ignore", "allow_fallbacks", "require_parameters", "data_collection",
                               "zdr", "sort", "quantizations", "max_price"},
                  "providerOptions": {"gateway"}},
    RESPONSES: {"reasoning": {"effort", "summary"}},
}
VERCEL_GATEWAY_FIELDS = frozenset({"only", "order"})  # never `models`: a fallback to another, unpriced model
RESPONSES_INCLUDES = frozenset({"reasoning.encrypted_content"})

# Anthropic betas that change nothing the meter relies on; any other (a 1M context billed at another rate,
# the files API, MCP servers, ...) is dropped from the forwarded headers.
ANTHROPIC_BETAS = ("fine-grained-tool-streaming-", "interleaved-thinking-", "token-efficient-tools-",
                   "output-128k-", "prompt-caching-")
FORWARDED_HEADERS = frozenset({"content-type", "accept", "user-agent", "anthropic-version", "x-goog-api-client"})


class CallRefused(Exception):
    """The call is not forwarded. `stop` ends the job too (a budget or policy decision, not a mistake)."""

    def __init__(self, status: int, reason: str, *, stop: bool = False):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.stop = stop


def _denied(why: str = "egress-denied") -> CallRefused:
    return CallRefused(403, why)


def _malformed() -> CallRefused:
    return CallRefused(400, "request-malformed", stop=True)


@dataclass(frozen=True)
class Call:
    """One forwardable call: what its answer is read as, whether it is billed, where it goes upstream."""

    api: str
    billed: bool
    path: str  # under the provider's base path, rebuilt by the gateway
    query: str = ""
    model: str = ""  # Google's, from the checked path


def checked_path(target: str, base: str) -> tuple[str, str]:
    """(path under the provider's base path, raw query) of an origin-form request target, or CallRefused."""
    path, _, query = target.partition("?")
    if not SAFE_PATH.fullmatch(path):
        raise _denied()
    segments = path.split("/")[1:]
    if any(segment in ("", ".", "..") for segment in segments):
        raise _denied()
    if base:
        if not path.startswith(base + "/"):
            raise _denied()
        path = path[len(base):]
    return path, query


def match(api: str, method: str, target: str, base: str) -> Call:
    """The table's call for this request, or CallRefused(403 egress-denied)."""
    path, query = checked_path(target, base)
    if method != "POST":
        raise _denied()
    if api == GOOGLE:
        found = GOOGLE_CALL.fullmatch(path)
        if found is None:
            raise _denied()
        model, verb = found.groups()
        allowed_query = {"", "alt=sse"} if verb == "streamGenerateContent" else {""}
        if query not in allowed_query:
            raise _denied()
        return Call(api, verb != "countTokens", f"/models/{model}:{verb}", query, model)
    if query:
        raise _denied()
    calls = {ANTHROPIC: {"/v1/messages": True, "/v1/messages/count_tokens": False},
             COMPLETIONS: {"/chat/completions": True},
             RESPONSES: {"/responses": True}}.get(api, {})
    if path not in calls:
        raise _denied()
    return Call(api, calls[path], path)


# --- the body ------------------------------------------------------------------------------------------

def _object(pairs: list[tuple[str, object]]) -> dict:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise ValueError("duplicate key")
    return document


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _values_at_most(body: bytes, most: int) -> bool:
    """Whether the document holds at most `most` JSON values: what its parse costs in memory is bounded by that,
    not by its bytes (8 MiB of `[{},{},...]` are millions of objects). Counted without parsing: commas and
    openings, outside strings only when the quick count over everything says it might matter."""
    if len(body) <= most or body.count(b",") + body.count(b"{") + body.count(b"[") <= most:
        return True  # every value takes a byte at least
    outside = JSON_STRING.sub(b"", body)
    return outside.count(b",") + outside.count(b"{") + outside.count(b"[") <= most


def parse(body: bytes) -> dict:
    """One JSON object, strictly, or CallRefused(request-malformed); one of too many values: request-too-large."""
    if not _values_at_most(body, MAX_JSON_VALUES):
        raise CallRefused(413, "request-too-large")
    try:
        document = json.loads(body.decode("utf-8"), object_pairs_hook=_object, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _malformed() from None
    if not isinstance(document, dict):
        raise _malformed()
    return document


def serialise(document: dict) -> bytes:
    """What is forwarded. ASCII escapes: a lone surrogate the container sent cannot break the encoding."""
    return json.dumps(document, separators=(",", ":")).encode()


def model_of(call: Call, document: dict) -> str:
    if call.api == GOOGLE:
        if "model" in document and document["model"] not in (call.model, f"models/{call.model}"):
            raise _malformed()
        return call.model
    model = document.get("model")
    if not isinstance(model, str) or not MODEL_NAME.fullmatch(model):
        raise _malformed()
    return model


# --- what the meter cannot bound ------------------------------------------------------------------------

def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _items(value) -> list:
    return value if isinstance(value, list) else []


def _tools_are_functions(tools, allowed_types: set) -> bool:
    return all(isinstance(tool, dict) and tool.get("type", "custom" if "custom" in allowed_types else None)
               in allowed_types for tool in _items(tools))


def _walk(value):
    """Every object in the document (iteratively: a deep document cannot exhaust the stack)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def unknown_field(call: Call, document: dict, host: str) -> bool:
    """Whether the document carries a field this API shape (on this upstream `host`) is not known to take."""
    if call.api == GOOGLE:
        requests = [document]
        if not call.billed:  # countTokens: {"contents": ...} or {"generateContentRequest": {...}}
            if set(document) - {"contents", "generateContentRequest"}:
                return True
            requests = [_mapping(document.get("generateContentRequest"))]
        for request in requests:
            config = _mapping(request.get("generationConfig"))
            if set(request) - GOOGLE_REQUEST_FIELDS or set(config) - GOOGLE_GENERATION_FIELDS \
                    or set(_mapping(config.get("thinkingConfig"))) - GOOGLE_THINKING_FIELDS \
                    or config.get("responseModalities", ["TEXT"]) != ["TEXT"]:
                return True
        return False
    if call.api == ANTHROPIC and not call.billed:
        known = COUNT_TOKENS_FIELDS
    else:
        extra = next((fields.get(call.api, frozenset()) for name, fields in HOST_FIELDS.items()
                      if host == name or host.endswith("." + name)), frozenset())
        known = REQUEST_FIELDS[call.api] | extra
    if set(document) - known:
        return True
    for name, keys in NESTED_FIELDS[call.api].items():
        if set(_mapping(document.get(name))) - keys:
            return True
    if call.api == COMPLETIONS and set(_mapping(_mapping(document.get("providerOptions")).get("gateway"))) \
            - VERCEL_GATEWAY_FIELDS:
        return True
    return call.api == RESPONSES and not all(isinstance(item, str) and item in RESPONSES_INCLUDES
                                             for item in _items(document.get("include")))


def refusal(call: Call, document: dict) -> str | None:
    """The reason a call's content cannot be forwarded (`provider-feature-refused`), or None."""
    return "provider-feature-refused" if _UNSERVED_FEATURE[call.api](call, document) else None


def _anthropic_unserved(call: Call, document: dict) -> bool:
    if any(key in document for key in ("mcp_servers", "container", "service_tier")):
        return True
    if not _tools_are_functions(document.get("tools"), {"custom"}):
        return True
    for item in _walk(document.get("messages")):
        kind = item.get("type")
        if kind in ("document", "container_upload", "mcp_tool_use", "server_tool_use"):
            return True
        if kind == "image" and _mapping(item.get("source")).get("type") != "base64":
            return True
        if _mapping(item.get("cache_control")).get("ttl", "5m") != "5m":
            return True  # an hour's cache write is billed at another rate than the price list's
    return any(_mapping(_mapping(block).get("cache_control")).get("ttl", "5m") != "5m"
               for block in [*_items(document.get("system")), *_items(document.get("tools"))])


def _completions_unserved(call: Call, document: dict) -> bool:
    if any(key in document for key in ("web_search_options", "audio", "prediction", "functions")):
        return True
    if document.get("n", 1) != 1 or document.get("service_tier", "auto") not in ("auto", "default", "flex"):
        return True
    if document.get("modalities", ["text"]) != ["text"]:
        return True
    if not _tools_are_functions(document.get("tools"), {"function"}):
        return True
    for item in _walk(document.get("messages")):
        kind = item.get("type")
        if kind in ("file", "input_audio"):
            return True
        if kind == "image_url" and not str(_mapping(item.get("image_url")).get("url", "")).startswith("data:"):
            return True
    return False


def _responses_unserved(call: Call, document: dict) -> bool:
    if any(key in document for key in ("previous_response_id", "conversation", "prompt", "background")):
        return True
    if document.get("service_tier", "auto") not in ("auto", "default", "flex"):
        return True
    if not _tools_are_functions(document.get("tools"), {"function"}):
        return True
    for item in _walk(document.get("input")):
        kind = item.get("type")
        if kind in ("input_file", "item_reference", "input_audio"):
            return True
        if kind == "input_image" and not str(item.get("image_url", "")).startswith("data:"):
            return True
    return False


def _google_unserved(call: Call, document: dict) -> bool:
    """Google (its fields camelCase only: unknown_field): one answer, function tools only."""
    requests = [document]
    if not call.billed:  # countTokens: {"contents": ...} or {"generateContentRequest": {...}}
        requests = [_mapping(document.get("generateContentRequest"))] if "generateContentRequest" in document else []
    for request in requests:
        config = _mapping(request.get("generationConfig"))
        if config.get("candidateCount", 1) != 1:
            return True
        if any(not isinstance(tool, dict) or set(tool) - {"functionDeclarations"}
               for tool in _items(request.get("tools"))):
            return True
    for item in _walk(document):
        if any(key in item for key in ("fileData", "file_data", "inline_data", "executableCode", "cachedContent")):
            return True
        if "inlineData" in item and not GOOGLE_INLINE_TYPES.fullmatch(
                str(_mapping(item["inlineData"]).get("mimeType", ""))):
            return True
    return False


# Each API's features the gateway does not forward (it could not meter or bound them).
_UNSERVED_FEATURE = {ANTHROPIC: _anthropic_unserved, COMPLETIONS: _completions_unserved,
                     RESPONSES: _responses_unserved, GOOGLE: _google_unserved}


def media_count(call: Call, document: dict) -> int:
    """Inline images in the document (the only media refusal() lets through)."""
    if call.api == GOOGLE:
        return sum(1 for item in _walk(document) if "inlineData" in item)
    kind = {ANTHROPIC: "image", COMPLETIONS: "image_url", RESPONSES: "input_image"}[call.api]
    return sum(1 for item in _walk(document) if item.get("type") == kind)


def input_bound(call: Call, body: bytes, document: dict) -> int:
    """Tokens the call's input can cost at most: one per byte of the body as the container sent it (a tokenizer
    bills at most a token per byte of text, and JSON never spells a character in fewer bytes than UTF-8), the
    provider's template, and each image's largest tile count."""
    return len(body) + TEMPLATE_TOKENS + MEDIA_TOKENS * media_count(call, document)


# --- the output ceiling -----------------------------------------------------------------------------------

def output_ceiling(call: Call, document: dict) -> int | None:
    """The output ceiling the request asks for: None when it sets none, or one the gateway cannot read as one
    positive integer (two fields that disagree, a float): the gateway then writes its own."""
    values = {value for value in _ceiling_values(call, document) if value is not None}
    if len(values) != 1:
        return None
    (value,) = values
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _ceiling_values(call: Call, document: dict) -> list:
    if call.api == ANTHROPIC:
        return [document.get("max_tokens")]
    if call.api == COMPLETIONS:
        return [document.get("max_completion_tokens"), document.get("max_tokens")]
    if call.api == RESPONSES:
        return [document.get("max_output_tokens")]
    return [_mapping(document.get("generationConfig")).get("maxOutputTokens")]


def set_output_ceiling(call: Call, document: dict, ceiling: int) -> None:
    """Hold the call's output (reasoning included) to `ceiling` tokens, in every field the provider reads."""
    if call.api == ANTHROPIC:
        document["max_tokens"] = ceiling
        thinking = document.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or budget >= ceiling:
                # Anthropic wants 1024 <= budget_tokens < max_tokens; below that the call thinks not at all.
                document["thinking"] = ({**thinking, "budget_tokens": ceiling - 1} if ceiling > 1024
                                        else {"type": "disabled"})
    elif call.api == COMPLETIONS:
        fields = [name for name in ("max_completion_tokens", "max_tokens") if name in document]
        for name in fields or ("max_completion_tokens", "max_tokens"):
            document[name] = ceiling
    elif call.api == RESPONSES:
        document["max_output_tokens"] = ceiling
    else:
        config = document.setdefault("generationConfig", {})
        if not isinstance(config, dict):
            raise _malformed()
        config["maxOutputTokens"] = ceiling  # Google counts thinking within it
        thinking = config.get("thinkingConfig")
        if isinstance(thinking, dict) and isinstance(thinking.get("thinkingBudget"), int) \
                and thinking["thinkingBudget"] > ceiling:
            thinking["thinkingBudget"] = ceiling


def ask_for_usage(call: Call, document: dict) -> bool:
    """A streamed chat completion reports its usage only when asked: always ask (set, or overwrite). Whether the
    document changed."""
    if call.api != COMPLETIONS or document.get("stream") is not True:
        return False
    options = document.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    document["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return True


def forwarded_headers(headers) -> dict[str, str]:
    """The request's headers the provider needs, nothing else (no credential, no header that opens a feature)."""
    kept = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower in FORWARDED_HEADERS or lower.startswith("x-stainless-"):
            kept[name] = value
        elif lower == "anthropic-beta":
            betas = [beta.strip() for beta in value.split(",")
                     if beta.strip().startswith(ANTHROPIC_BETAS)]
            if betas:
                kept[name] = ",".join(betas)
    return kept
