"""`manage.py check` names a gateway setting no job could run under, before any job finds out."""

import pytest

from apps.worker.gates.checks import egress_settings


def problems(**overrides) -> list[str]:
    return [f"{error.id}: {error.msg}" for error in egress_settings(None)]


@pytest.mark.parametrize("name, value, expected", [
    ("PI_EGRESS_ALLOW", "registry.npmjs.org", "worker.E004: PI_EGRESS_ALLOW: 'registry.npmjs.org' is not host:port"),
    ("PI_PROVIDER_BASE_URL", "ftp://llm.example/v1", "worker.E005"),
    ("PI_PROVIDER_API", "mistral-conversations", "worker.E006"),
    ("PI_MODEL_PRICES", "/no/such/prices.json", "worker.E008: PI_MODEL_PRICES: /no/such/prices.json"),
])
def test_a_bad_gateway_setting_fails_the_check(settings, name, value, expected):
    setattr(settings, name, value)
    assert any(problem.startswith(expected) for problem in problems()), problems()


def test_a_custom_provider_must_say_where_it_is(settings, tmp_path):
    settings.PI_PROVIDER = "acme"
    (problem,) = problems()
    assert problem.startswith("worker.E007") and "PI_PROVIDER_BASE_URL, PI_PROVIDER_API, PI_MODEL" in problem
    assert "PI_PROVIDER_KEY_VARS (acme:<VARIABLE>)" in problem
    settings.PI_PROVIDER_BASE_URL, settings.PI_PROVIDER_API = "https://llm.acme.example/v1", "openai-completions"
    settings.PI_MODEL, settings.PI_PROVIDER_KEY_VARS = "coder-1", "acme:ACME_KEY"
    (warning,) = problems()  # configured; only its price is unknown, which the operator's price list fixes
    assert warning.startswith("worker.W005: PI_MODEL=coder-1 has no known price for acme")
    prices = tmp_path / "prices.json"
    prices.write_text('{"acme/coder-1": {"input": 1, "output": 2}}')
    settings.PI_MODEL_PRICES = str(prices)
    assert problems() == []


def test_the_defaults_pass(settings):
    assert problems() == []
