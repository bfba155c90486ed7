"""Secrets (`run.secrets`): real resolver scripts for every answer, the profile choice, reserved names, and
a real worker whose container receives the resolved value while no log, record or job file ever holds it."""

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from django.forms.models import model_to_dict
from rq import Queue

from apps.worker.forges import comments
from apps.worker.gates import hostscripts, secrets
from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec

VALUE = "s3cr3t-Value with spaces & $dollars"
REFERENCE = "npm/ci-publish"


def write_resolver(folder: Path, body: str, name: str = "resolver-vault.sh") -> Path:
    """A real resolver script; it logs its argv and the names of its environment next to itself."""
    path = folder / name
    path.write_text(f'#!/bin/sh\necho "$#:$1" >> "{folder}/calls"\nenv | sed "s/=.*//" > "{folder}/env-names"\n'
                    f"{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(folder: Path) -> list[str]:
    path = folder / "calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def resolver(settings, tmp_path):
    """Declare one profile `vault` whose resolver runs `body`."""

    def make(body: str, **profiles) -> Path:
        path = write_resolver(tmp_path, body)
        declared = {"vault": str(path), **profiles}
        settings.PI_SECRET_PROFILES = ",".join(f"{name}:{where}" for name, where in declared.items())
        return path

    settings.PI_SECRET_RESOLVE_TIMEOUT_MS = 10000
    return make


def needing(job_id="gh-s1", secrets_map=None, profile="", **fields):
    return forge_spec(job_id, secrets=secrets_map or {"NPM_TOKEN": REFERENCE}, secrets_profile=profile, **fields)


def refusal(spec) -> str:
    with pytest.raises(secrets.SecretsRefused) as refused:
        secrets.resolve(spec)
    return refused.value.reason


def unreachable(spec) -> str:
    with pytest.raises(secrets.ResolverUnreachable) as fault:
        secrets.resolve(spec)
    return fault.value.why


# --- what a resolver answers -------------------------------------------------------------------------------

def test_exit_0_resolves_each_reference_once_with_only_the_reference_as_argument(resolver, tmp_path):
    resolver("printf '%s\\n' \"value-for-$1\"")

    values = secrets.resolve(needing(secrets_map={"NPM_TOKEN": REFERENCE, "SENTRY_DSN": "sentry/dsn"}))

    assert values == {"NPM_TOKEN": f"value-for-{REFERENCE}", "SENTRY_DSN": "value-for-sentry/dsn"}
    assert sorted(calls(tmp_path)) == [f"1:{REFERENCE}", "1:sentry/dsn"]


def test_only_one_trailing_newline_is_dropped_and_inner_whitespace_is_kept(resolver):
    resolver("printf '  two\\nlines \\n\\n'")
    assert secrets.resolve(needing()) == {"NPM_TOKEN": "  two\nlines \n"}


def test_a_job_without_secrets_runs_no_resolver(resolver, tmp_path):
    resolver("exit 0")
    assert secrets.resolve(forge_spec("gh-none")) == {}
    assert calls(tmp_path) == []


def test_the_resolver_gets_a_closed_environment(resolver, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-worker-key")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-worker-token")
    monkeypatch.setenv("REDIS_URL", os.environ.get("REDIS_URL", "redis://x"))
    resolver("echo ok")

    secrets.resolve(needing())

    names = set((tmp_path / "env-names").read_text().split())
    assert "PATH" in names
    assert names <= set(hostscripts.CLOSED_ENVIRONMENT) | {"PWD", "SHLVL", "_"}  # the shell's own additions
    assert not names & {"ANTHROPIC_API_KEY", "GITHUB_TOKEN", "REDIS_URL", "DATABASE_URL"}


@pytest.mark.parametrize("body", [
    "exit 2",                                   # the resolver does not know the reference
    "printf 'half'; exit 2",                    # exit 2 wins over what it printed
    "exit 0",                                   # printed nothing
    "echo",                                     # printed only a newline
    "printf 'a\\000b'",                         # a NUL cannot be an environment value
    "printf '\\377\\376'",                      # not UTF-8
    "head -c 70000 /dev/zero | tr '\\000' x",   # more than 64 KiB
    "yes x",                                    # prints forever: stopped at the cap, not at the timeout
], ids=["exit-2", "exit-2-with-output", "empty", "newline-only", "nul", "not-utf8", "oversized", "endless"])
def test_wrong_or_unusable_answers_refuse_unresolved(resolver, body):
    resolver(body)
    assert refusal(needing()) == "secret-unresolved"


def test_a_value_of_exactly_64_kib_is_accepted(resolver):
    resolver("head -c 65536 /dev/zero | tr '\\000' y")
    assert secrets.resolve(needing())["NPM_TOKEN"] == "y" * 65536


@pytest.mark.parametrize("body, why", [
    ("exit 1", "exit-1"),
    ("echo value; exit 1", "exit-1"),
    ("exit 3", "exit-3"),
    ("exit 127", "exit-127"),
    ("kill -9 $$", "signal-9"),
], ids=["exit-1", "exit-1-with-output", "exit-3", "exit-127", "killed"])
def test_outages_are_unreachable(resolver, body, why):
    resolver(body)
    assert unreachable(needing()) == why


def test_a_resolver_that_hangs_times_out_as_unreachable(resolver, settings):
    resolver("sleep 30; echo late")
    settings.PI_SECRET_RESOLVE_TIMEOUT_MS = 300
    assert unreachable(needing()) == "timeout"


def test_a_background_child_holding_stdout_does_not_delay_the_answer(resolver, settings):
    resolver("(sleep 30 &) ; echo quick")
    settings.PI_SECRET_RESOLVE_TIMEOUT_MS = 5000
    assert secrets.resolve(needing()) == {"NPM_TOKEN": "quick"}


def test_a_missing_or_not_executable_resolver_is_unreachable(settings, tmp_path):
    settings.PI_SECRET_PROFILES = f"vault:{tmp_path}/not-there.sh"
    assert unreachable(needing()) == "spawn-failed"

    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho value\n")
    settings.PI_SECRET_PROFILES = f"vault:{plain}"
    assert unreachable(needing(job_id="gh-s2")) == "spawn-failed"


def test_a_reference_that_looks_like_an_option_never_reaches_the_resolver(resolver, tmp_path):
    resolver("echo value")
    assert refusal(needing(secrets_map={"NPM_TOKEN": "--help"})) == "secret-unresolved"
    assert calls(tmp_path) == []


def test_secrets_this_worker_cannot_read_are_refused(resolver, tmp_path):
    resolver("echo value")
    assert refusal(forge_spec("gh-odd", secrets=["NPM_TOKEN"])) == "secret-unresolved"
    assert calls(tmp_path) == []


# --- which profile -----------------------------------------------------------------------------------------

def test_the_only_declared_profile_is_used_when_the_job_names_none(resolver):
    resolver("echo from-vault")
    assert secrets.resolve(needing()) == {"NPM_TOKEN": "from-vault"}


def test_a_named_profile_picks_its_own_resolver(resolver, tmp_path):
    (tmp_path / "other").mkdir()
    other = write_resolver(tmp_path / "other", "echo from-prod")
    resolver("echo from-vault", prod=str(other))

    assert secrets.resolve(needing(profile="prod")) == {"NPM_TOKEN": "from-prod"}
    assert secrets.resolve(needing(profile="vault")) == {"NPM_TOKEN": "from-vault"}


def test_several_profiles_and_none_named_is_ambiguous(resolver, tmp_path):
    resolver("echo value", prod="/usr/bin/true")
    assert refusal(needing()) == "secret-profile-ambiguous"
    assert calls(tmp_path) == []


def test_an_unknown_profile_or_none_declared_is_refused(resolver, settings, tmp_path):
    resolver("echo value")
    assert refusal(needing(profile="prod")) == "secret-profile-unknown"
    settings.PI_SECRET_PROFILES = ""
    assert refusal(needing()) == "secret-profile-unknown"
    assert calls(tmp_path) == []


# --- reserved names ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "PI_JOB_ID", "PI_PROVIDER", "pi_model", "HOME", "PATH", "GITHUB_TOKEN", "GH_TOKEN", "GITHUB_API_URL",
    "GITLAB_TOKEN", "GITLAB_HOST", "FORGEJO_TOKEN", "FORGEJO_URL", "AZURE_DEVOPS_EXT_PAT", "SYSTEM_COLLECTIONURI",
    "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "HTTPS_PROXY", "https_proxy", "NODE_OPTIONS", "LD_PRELOAD",
    "NOT-A-NAME", "1ABC", "A=B",
])
def test_names_the_runtime_sets_are_refused_before_any_resolver_runs(resolver, tmp_path, name):
    resolver("echo value")
    assert refusal(needing(secrets_map={"NPM_TOKEN": "npm/ci", name: "x/y"})) == "secret-name-reserved"
    assert calls(tmp_path) == []


def test_a_mapped_provider_variable_is_reserved_too(resolver, settings):
    resolver("echo value")
    settings.PI_PROVIDER_KEY_VARS = "acme-llm:ACME_TOKEN"
    assert refusal(needing(secrets_map={"ACME_TOKEN": "acme/key"})) == "secret-name-reserved"
    settings.PI_PROVIDER_KEY_VARS = ""
    assert secrets.resolve(needing(secrets_map={"ACME_TOKEN": "acme/key"})) == {"ACME_TOKEN": "value"}


@pytest.mark.django_db
def test_every_name_the_container_is_given_is_reserved():
    from apps.worker.gates import container_step, runtime_settings
    from apps.worker.sandbox.gateway import EgressGateway

    spec = forge_spec("gh-env", model="m", exclude_tools=("bash",))
    runtime = replace(runtime_settings.current(), max_tokens=5)
    given = container_step.container_environment(spec, runtime, "anthropic", EgressGateway.container_environment())
    assert all(secrets.is_reserved(name) for name in given)


@pytest.mark.django_db
def test_a_jobs_max_turns_lowers_the_deployments_cap_and_never_raises_it():
    from apps.worker.gates import container_step, runtime_settings

    runtime = replace(runtime_settings.current(), max_turns=30)
    turns = {given: container_step.container_environment(forge_spec("gh-turns", max_turns=given), runtime, "anthropic",
                                                  {})["PI_MAX_TURNS"] for given in (None, 5, 90)}
    assert turns == {None: "30", 5: "5", 90: "30"}


# --- logs, comments, settings check ------------------------------------------------------------------------

def test_logs_name_the_count_profile_and_reason_never_the_reference_value_or_path(resolver, caplog, tmp_path):
    path = resolver(f"printf '%s' '{VALUE}'")
    with caplog.at_level("DEBUG", logger="pidispatch"):
        secrets.resolve(needing())
        path.write_text("#!/bin/sh\nexit 2\n")
        refusal(needing(job_id="gh-s9"))
    assert "secrets_resolved job=gh-s1 count=1 profile=vault" in caplog.text
    assert "secrets_refused job=gh-s9 count=1 profile=vault reason=secret-unresolved" in caplog.text
    for private in (VALUE, REFERENCE, str(path), "resolver-vault"):
        assert private not in caplog.text


def test_each_reason_has_a_fixed_sentence_without_name_reference_or_path():
    for reason in ("secret-name-reserved", "secret-profile-unknown", "secret-profile-ambiguous", "secret-unresolved"):
        assert comments.REFUSED[reason].startswith("Refused: ") and "/" not in comments.REFUSED[reason]
    assert comments.FAILED["secret-resolver-unreachable"].startswith("Failed: ")


def test_manage_py_check_names_a_resolver_that_cannot_run(settings, tmp_path):
    from apps.worker.gates.checks import secret_resolver_settings

    settings.PI_SECRET_PROFILES = f"vault:{tmp_path}/missing.sh"
    (warning,) = secret_resolver_settings(None)
    assert warning.id == "worker.W001" and "'vault'" in warning.msg and str(tmp_path) not in warning.msg
    settings.PI_SECRET_RESOLVE_TIMEOUT_MS = 0
    assert {found.id for found in secret_resolver_settings(None)} == {"worker.E002", "worker.W001"}


# --- a real worker and container ---------------------------------------------------------------------------

def _everything_in_redis(redis_conn) -> bytes:
    dump = b""
    for key in redis_conn.scan_iter(count=1000):
        kind = redis_conn.type(key)
        if kind == b"string":
            dump += redis_conn.get(key) or b""
        elif kind == b"hash":
            dump += b"".join(k + v for k, v in redis_conn.hgetall(key).items())
        elif kind in (b"list",):
            dump += b"".join(redis_conn.lrange(key, 0, -1))
        elif kind in (b"set",):
            dump += b"".join(redis_conn.smembers(key))
        elif kind == b"zset":
            dump += b"".join(member for member, _ in redis_conn.zrange(key, 0, -1, withscores=True))
    return dump


@pytest.mark.django_db(transaction=True)
def test_the_container_receives_the_resolved_value_and_nothing_else_holds_it(run_worker, settings, tmp_path,
                                                                              redis_conn):
    path = write_resolver(tmp_path, f"[ \"$1\" = '{REFERENCE}' ] || exit 2\nprintf '%s\\n' '{VALUE}'")
    job_id = enqueue_spec(needing("gh-secret-e2e", body="fake-agent:env-to-file=NPM_TOKEN fake-agent:report",
                                  profile="vault"))

    worker = run_worker("pi-jobs", env_overrides={"PI_SECRET_PROFILES": f"vault:{path},spare:/usr/bin/false",
                                                  "PI_LOG_LEVEL": "DEBUG"})

    run = Run.objects.get(job_id=job_id)
    job_root = Path(settings.PI_JOB_ROOT) / job_id
    assert (job_root / "workspace" / "env-NPM_TOKEN.txt").read_text() == VALUE
    # The agent wrote the value into its work: the worker pushes none of it, and says where, by the secret's name.
    assert (run.outcome, run.reason, run.publish_refusal) == (Outcome.POLICY, "secret-in-work",
                                                              "env-NPM_TOKEN.txt holds NPM_TOKEN")
    report = json.loads((job_root / "workspace" / "sandbox-report.json").read_text())
    assert "NPM_TOKEN" in report["env_names"].split()
    assert calls(tmp_path) == [f"1:{REFERENCE}"]

    logs = worker.stdout + worker.stderr
    assert f"secrets_resolved job={job_id} count=1 profile=vault" in logs
    record = json.dumps(model_to_dict(run), default=str)
    job_files = (job_root / "job" / "event.json").read_text() + (job_root / "job" / "prompt.md").read_text()
    for where in (logs, record, job_files, _everything_in_redis(redis_conn).decode("utf-8", "replace")):
        assert VALUE not in where
    for private in (REFERENCE, str(path), "resolver-vault"):
        assert private not in logs and private not in record


@pytest.mark.django_db(transaction=True)
def test_an_unresolved_reference_is_refused_before_the_workspace_and_the_container(run_worker, settings, tmp_path,
                                                                                     github_stand_in):
    path = write_resolver(tmp_path, "exit 2")
    job_id = enqueue_spec(needing("gh-secret-refused", repo="acme/secret-refusal", number=31,
                                  body="fake-agent:env-to-file=NPM_TOKEN"))

    worker = run_worker("pi-jobs", env_overrides={"PI_SECRET_PROFILES": f"vault:{path}"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.exit_code, run.budget_reserved) == (
        Outcome.POLICY, "secret-unresolved", None, False)
    assert not (Path(settings.PI_JOB_ROOT) / job_id).exists()  # no workspace, so no container either
    assert calls(tmp_path) == [f"1:{REFERENCE}"]
    (posted,) = github_stand_in.posted("/repos/acme/secret-refusal/issues/31/comments")
    assert posted["body"] == comments.REFUSED["secret-unresolved"]
    logs = worker.stdout + worker.stderr
    assert f"secrets_refused job={job_id} count=1 profile=vault reason=secret-unresolved" in logs
    assert REFERENCE not in logs and str(path) not in logs


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_resolver_is_retried_then_fails(run_worker, tmp_path, redis_conn):
    path = write_resolver(tmp_path, "exit 1")
    job_id = enqueue_spec(needing("gh-secret-down", repo="acme/secret-down", number=32))
    env = {"PI_SECRET_PROFILES": f"vault:{path}"}

    run_worker("pi-jobs", env_overrides=env)
    assert Queue("pi-jobs", connection=redis_conn).fetch_job(job_id).get_status() == "scheduled"
    wait_for(lambda: run_worker("pi-jobs", env_overrides=env) and Run.objects.filter(job_id=job_id, attempt=2).exists(),
             timeout=60, interval=0.5, what="the second attempt")

    runs = list(Run.objects.filter(job_id=job_id).order_by("attempt"))
    assert [(r.attempt, r.outcome, r.reason) for r in runs] == [
        (1, Outcome.FAILED, "secret-resolver-unreachable"), (2, Outcome.FAILED, "secret-resolver-unreachable")]
    assert len(calls(tmp_path)) == 2
