"""One table of forges (apps/forge_registry.py): every list of forges elsewhere is read from it, so a forge
added there is served, validated, named in job ids and run kinds, and given an API client, with nothing else
spelled out again."""

from django.urls import resolve, reverse

from apps import forge_registry
from apps.receiver import authority, forge_config, intake, validation
from apps.receiver.models import RunKind
from apps.worker import jobs
from apps.worker.forges import forge_client, forge_client_classes


def test_every_forge_of_the_table_is_served_validated_named_and_has_a_client():
    names = forge_registry.NAMES
    assert names == ("github", "gitlab", "forgejo", "azure")
    for forge in forge_registry.FORGES:
        assert resolve(reverse(f"hook-{forge.name}")).func.__name__ == f"{forge.name}_hook"
        assert intake.NORMALISERS[forge.name] is forge_registry.hook(forge.name).normalise
        assert jobs.DELIVERY_PREFIXES[forge.name] == forge.job_prefix
        assert authority.PENDING_REASONS[forge.name] == forge.lookup_pending_reason
        assert validation.PR_ACTIONS[forge.name] == forge.pr_actions
        assert (forge.name, forge.label) in RunKind.choices
        assert type(forge_client(forge.name)) is forge_registry.client_class(forge.name)
        assert forge_client(forge.name).forge == forge.name
    assert forge_config.FORGES == validation.FORGE_KINDS == jobs.FORGE_KINDS == names
    assert {cls.forge for cls in forge_client_classes()} == set(names)
    assert len(set(jobs.DELIVERY_PREFIXES.values())) == len(names)  # a job id names its forge unambiguously


def test_an_unknown_forge_is_refused_with_the_known_ones():
    try:
        forge_client("bitbucket")
    except ValueError as error:
        assert "bitbucket" in str(error)
    else:
        raise AssertionError("an unknown forge got a client")
    try:
        forge_registry.get("bitbucket")
    except ValueError as error:
        assert "github, gitlab, forgejo, azure" in str(error)
