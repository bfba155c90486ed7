"""Which model names a trigger, a manual run or the deployment may give: those with a known price.

A name is known for a provider when the operator's prices (PI_MODEL_PRICES) or pi's own list price it, or when it is
a pattern pi resolves to one of those (pi takes a name that is part of a listed id: `claude-sonnet-4` and `sonnet`
both name priced models, and the gateway records the one pi called); a `:<thinking level>` suffix is pi's too. The
deployment's own PI_PROVIDER/PI_MODEL is judged once, by its settings check and doctor, not again on each rule.

Any other name is refused where it is given, saying which models the provider prices, unless
PI_ALLOW_UNKNOWN_MODELS is on: then it is accepted with a warning, its runs' cost is recorded as unknown (never
$0), and under any dollar cap its jobs are refused `model-unpriced` before a token is spent (gate 11c).
"""

from __future__ import annotations

import re

from django.conf import settings

from apps.worker.sandbox import prices, providers

THINKING_SUFFIX = re.compile(r":(?:off|minimal|low|medium|high|xhigh)$")
DATED = re.compile(r"-\d{8}$|-latest$")  # pi's dated ids and moving aliases: the names listed last
NAMED = 6  # priced models named in a sentence before "and N more"


def priced_models(provider: str) -> list[str]:
    """The provider's priced model ids: the operator's, then pi's (undated names first)."""
    operator = [key.partition("/")[2] for key in prices.operator_table() if key.partition("/")[0] == provider.lower()]
    builtin = list((providers.builtin_providers().get(provider.lower()) or {}).get("prices", {}))
    return list(dict.fromkeys(operator + sorted(builtin, key=lambda model: (bool(DATED.search(model)), model))))


def is_priced(provider: str, model: str) -> bool:
    """Priced by name, or a pattern pi resolves to a priced model."""
    name = THINKING_SUFFIX.sub("", model).lower()
    return prices.is_listed(provider.lower(), name) or any(name in listed.lower() for listed in priced_models(provider))


def is_known(provider: str, model: str) -> bool:
    if provider == settings.PI_PROVIDER and model == settings.PI_MODEL:
        return True  # the deployment's own: its settings check says whether it is priced
    return is_priced(provider, model)


def unknown_sentence(provider: str, model: str) -> str:
    """Why `model` is not known, and what the provider does price."""
    listed = priced_models(provider)
    if not listed:
        offer = (f"this deployment knows no price for any {provider} model: price it in PI_MODEL_PRICES "
                 "(\"provider/model\": dollars per million tokens)")
    else:
        named = ", ".join(listed[:NAMED]) + (f" and {len(listed) - NAMED} more" if len(listed) > NAMED else "")
        offer = f"{provider} prices {named}; pick one of those, or price it in PI_MODEL_PRICES"
    return f"{provider} has no model “{model}” with a known price ({offer})."


def refusal(provider: str, model: str) -> str | None:
    """The sentence that refuses an unknown model, or None when it is known or PI_ALLOW_UNKNOWN_MODELS accepts it
    (`warning` then says so)."""
    if not model or is_known(provider, model) or settings.PI_ALLOW_UNKNOWN_MODELS:
        return None
    return unknown_sentence(provider, model) + " PI_ALLOW_UNKNOWN_MODELS=true accepts it at an unknown cost."


def warning(provider: str, model: str) -> str | None:
    """What an operator who allowed unknown models is told when one is given: its cost will not be known."""
    if not model or is_known(provider, model):
        return None
    return (f"{provider} has no price for “{model}”: its runs' cost will be unknown, and any dollar cap refuses them "
            "(model-unpriced) before a call.")


def entries_refusal(entries, name: str) -> str | None:
    """The first `provider/model` entry of an allowed-model list that is not known, as a sentence for `name`."""
    for entry in entries or ():
        provider, _, model = str(entry).partition("/")
        problem = refusal(provider, model)
        if problem:
            return f"{name}: {problem}"
    return None


def deployment_warning() -> str | None:
    """PI_MODEL without a known price: every run of the deployment's default costs an unknown amount."""
    model = settings.PI_MODEL
    if not model or is_priced(settings.PI_PROVIDER, model):
        return None
    return (f"PI_MODEL={model} has no known price for {settings.PI_PROVIDER}: runs of the deployment's default model "
            "record an unknown cost, and any dollar cap refuses them (model-unpriced).")
