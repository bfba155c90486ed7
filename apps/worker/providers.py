"""Which environment variable carries a provider's credential, as pi reads it.

The worker reads the key from its own environment and hands it to the container under the same name,
and nothing else of its environment. `PI_PROVIDER_KEY_VARS` (`provider:VAR,...`) adds or overrides
entries for providers this table does not know.
"""

import os

from django.conf import settings

KEY_VARIABLES = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "google": "GEMINI_API_KEY",
    "groq": "GROQ_API_KEY",
    "cerebras": "CEREBRAS_API_KEY",
    "xai": "XAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "mistral": "MISTRAL_API_KEY",
    "zai": "ZAI_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
}


def key_variable_overrides() -> dict[str, str]:
    """PI_PROVIDER_KEY_VARS as {provider: VAR}."""
    return dict(entry.split(":", 1) for entry in settings.PI_PROVIDER_KEY_VARS.split(",") if ":" in entry)


def key_variable(provider: str) -> str | None:
    return key_variable_overrides().get(provider) or KEY_VARIABLES.get(provider)


def credential(provider: str) -> tuple[str, str] | None:
    """(variable name, value) for the provider, or None when this worker has no usable key for it."""
    variable = key_variable(provider)
    value = os.environ.get(variable, "") if variable else ""
    return (variable, value) if value.strip() else None
