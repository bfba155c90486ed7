"""The allowed-model list: which models a job's agent may call (`run.models`, else PI_ALLOWED_MODELS, else any).

An entry is `provider/model`, split at the first `/` (`openrouter/anthropic/claude-sonnet-4` is the provider
`openrouter` and its model `anthropic/claude-sonnet-4`); a list holds 1-16 entries with no two alike ignoring case,
and a job's main model (its provider and model, when both are set) must be one of them.

The list travels three ways: to pi as `--models` (PI_ALLOWED_MODELS in the container: the models it may choose
among), to the job's egress gateway (which forwards a call only for a listed model, else `model-not-allowed`),
and to the dollar gate (under a cap every listed model must be priced, else `model-unpriced`). A job's gateway
serves its one provider, so the entries that job can use are its provider's (`for_provider`); a deployment's list
may name several providers for jobs of each.
"""

from __future__ import annotations

import re

from django.conf import settings

from apps.worker.name_patterns import PROVIDER_PATTERN

MAX_MODELS = 16
# An exact model id (the gateway compares ids, so no pi pattern such as `~sonnet` or a glob).
MODEL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,63}$")


class ModelListError(ValueError):
    """A list that breaks a rule; the message says which, fit for a form, a CLI error or a settings check."""


def split_entry(entry: str) -> tuple[str, str]:
    provider, _, model = entry.partition("/")
    return provider, model


def entry_problem(entry) -> str | None:
    if not isinstance(entry, str):
        return f"{entry!r} is not a provider/model text"
    provider, model = split_entry(entry)
    if not PROVIDER_PATTERN.fullmatch(provider) or not MODEL_ID_PATTERN.fullmatch(model):
        return (f"{entry!r} is not provider/model (a provider of letters, digits, '.', '_' or '-', then '/', then "
                "the model's exact id, e.g. anthropic/claude-sonnet-4-5)")
    return None


def check(entries, name: str) -> tuple[str, ...]:
    """The list as a tuple, or ModelListError naming `name` (`run.models`, `PI_ALLOWED_MODELS`) and the rule."""
    if not isinstance(entries, (list, tuple)) or not 1 <= len(entries) <= MAX_MODELS:
        raise ModelListError(f"{name} must list 1 to {MAX_MODELS} provider/model entries, e.g. "
                             "[\"anthropic/claude-sonnet-4-5\", \"anthropic/claude-haiku-4-5\"].")
    seen: set[str] = set()
    for entry in entries:
        problem = entry_problem(entry)
        if problem:
            raise ModelListError(f"{name}: {problem}.")
        if entry.lower() in seen:
            raise ModelListError(f"{name} lists {entry!r} twice (entries are compared ignoring case).")
        seen.add(entry.lower())
    return tuple(entries)


def parse_setting(text: str, name: str = "PI_ALLOWED_MODELS") -> tuple[str, ...]:
    """`anthropic/claude-sonnet-4-5,anthropic/claude-haiku-4-5` (no spaces); empty = no list."""
    if not text:
        return ()
    if any(ch.isspace() for ch in text):
        raise ModelListError(f"{name} is a comma-separated list without spaces, e.g. "
                             "anthropic/claude-sonnet-4-5,anthropic/claude-haiku-4-5.")
    return check(text.split(","), name)


def main_model_problem(provider: str, model: str, entries, name: str) -> str | None:
    """When a provider, a model and a list are all set, the model must be on the list."""
    if not (provider and model and entries):
        return None
    if f"{provider}/{model}".lower() in {entry.lower() for entry in entries if isinstance(entry, str)}:
        return None
    return (f"{name} does not list the main model {provider}/{model}: add it to the list, or pick a listed model "
            "(the gateway would refuse every call of the main model).")


def deployment_list() -> tuple[str, ...]:
    return parse_setting(settings.PI_ALLOWED_MODELS)


def effective(job_models) -> tuple[str, ...]:
    """The job's own list (its trigger's `run.models`), else the deployment's; () means any model."""
    return tuple(job_models) if job_models else deployment_list()


def for_provider(entries, provider: str) -> tuple[str, ...]:
    """The model ids of `provider` on the list (what that provider's gateway may forward), as written."""
    return tuple(model for entry in entries for listed, model in [split_entry(entry)]
                 if listed.lower() == provider.lower())


def is_listed(entries, provider: str, model: str) -> bool:
    return f"{provider}/{model}".lower() in {entry.lower() for entry in entries}
