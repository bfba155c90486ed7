"""A trigger's skills folder (`run.skillsDir`, issue 46 §1): copied into the job only from under a root the host
declares (PI_SKILLS_ROOTS), judged by its real path, never pidispatch's own files; copied only as any user of the
host may read it, walked by descriptors so that a file or folder swapped for a link meanwhile is never followed;
within the bounds of the repository's `.pi/` copy. Each attack runs against the worker's real copy; the last ones
run whole jobs through a worker process."""

import logging
import stat
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from apps.worker.models import Outcome, Run
from apps.worker.sandbox import folder_roots, repo_skills, skills_folder
from apps.worker.sandbox.workspace import WorkspaceRefused
from tests.jobspecs import enqueue_spec, local_spec

PROVIDER_KEY = "sk-ant-api03-" + "Z9y8X7w6" * 6
FORGE_TOKEN = "ghp_" + "Q1w2E3r4T5" * 4


def skill(folder: Path, name: str, description: str = "Does it.") -> Path:
    (folder / name).mkdir(parents=True)
    (folder / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n\nDo {name}.\n")
    return folder / name


def secrets_file(folder: Path) -> Path:
    """What a deployment's environment file holds, readable by all, so only the roots and links stand between."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pidispatch.env").write_text(f"ANTHROPIC_API_KEY={PROVIDER_KEY}\nGITHUB_TOKEN={FORGE_TOKEN}\n")
    return folder / "pidispatch.env"


def copied_bytes(folder: Path) -> bytes:
    return b"".join(path.read_bytes() for path in folder.rglob("*") if path.is_file()) if folder.exists() else b""


@pytest.fixture
def root(tmp_path, settings):
    """The skills root this host declares, and a folder outside it."""
    declared = tmp_path / "skills-root"
    declared.mkdir()
    (tmp_path / "outside").mkdir()
    settings.PI_SKILLS_ROOTS = (str(declared),)
    return declared


def refused(source, destination) -> WorkspaceRefused:
    with pytest.raises(WorkspaceRefused) as caught:
        skills_folder.copy(str(source), destination)
    return caught.value


# --- the copy: what it takes ------------------------------------------------------------------------------------------

def test_a_skills_folder_is_copied_without_links_dot_files_or_executable_bits(root, tmp_path):
    source = root / "skills"
    skill(source, "review", "Reviews a change.")
    (source / "review" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (source / "review" / "run.sh").chmod(0o755)
    (source / ".hidden").write_text("no")
    (source / ".git").mkdir(mode=0o700)  # a dot-folder is not walked, so its mode does not matter
    (source / "review" / "passwd").symlink_to("/etc/passwd")
    (source / "elsewhere").symlink_to(tmp_path)

    copied = skills_folder.copy(str(source), tmp_path / "job" / "trigger-skills")

    target = tmp_path / "job" / "trigger-skills"
    assert copied == 2
    assert sorted(str(path.relative_to(target)) for path in target.rglob("*")) == \
        ["review", "review/SKILL.md", "review/run.sh"]
    assert stat.S_IMODE((target / "review" / "run.sh").stat().st_mode) == 0o644  # a plain file, never executable


@pytest.mark.parametrize("make, reason", [
    (lambda root: (root / "a" / "b" / "c" / "d").mkdir(parents=True) or (root / "a/b/c/d/e.md").write_text("x"),
     "skills-dir-too-deep"),
    (lambda root: (root / "big.md").write_bytes(b"x" * (repo_skills.MAX_FILE_BYTES + 1)), "skills-dir-file-too-large"),
    (lambda root: [(root / f"f{i}.md").write_text("x") for i in range(repo_skills.MAX_FILES + 1)],
     "skills-dir-too-many-files"),
    (lambda root: [(root / f"f{i}.md").write_bytes(b"x" * repo_skills.MAX_FILE_BYTES) for i in range(9)],
     "skills-dir-too-large"),
])
def test_a_skills_folder_past_a_bound_is_refused_naming_it(root, tmp_path, make, reason):
    source = root / "skills"
    source.mkdir()
    make(source)
    assert refused(source, tmp_path / "copy").reason == reason
    assert not (tmp_path / "copy").exists()  # nothing half-copied


def test_a_missing_skills_folder_or_a_link_to_one_is_skills_dir_missing(root, tmp_path):
    (root / "real").mkdir()
    (root / "link").symlink_to(root / "real")
    (root / "file").write_text("x")
    for source in (root / "absent", root / "link", root / "file"):
        assert refused(source, tmp_path / "copy").reason == "skills-dir-missing"


# --- where it may be: declared roots, by real path, never the deployment's files --------------------------------------

def test_without_declared_roots_no_skills_folder_is_copied(tmp_path, settings):
    settings.PI_SKILLS_ROOTS = ()
    skill(tmp_path / "skills", "review")
    assert refused(tmp_path / "skills", tmp_path / "copy").reason == "skills-dir-not-allowed"
    assert not (tmp_path / "copy").exists()


def test_a_folder_outside_the_roots_is_refused_and_a_link_out_of_a_root_is_judged_where_it_points(
        root, tmp_path, caplog):
    secrets_file(tmp_path / "outside")
    (root / "escape").symlink_to(tmp_path / "outside")
    (root / "team").mkdir()
    (root / "team" / "via-parent").symlink_to(tmp_path / "outside")
    with caplog.at_level(logging.WARNING, logger="pidispatch.worker"):
        for source in (tmp_path / "outside", root / "escape", root / "team" / "via-parent", Path("/etc"),
                       Path("/root/.ssh"), Path("/proc/self")):
            reason = refused(source, tmp_path / "copy")
            assert reason.reason == "skills-dir-not-allowed", source
            assert str(source) not in reason.hint and "outside" not in reason.hint  # the path stays on the host
    assert not (tmp_path / "copy").exists()
    assert f"folder='{tmp_path / 'outside'}'" in caplog.text  # the host's log names the real path


def test_the_deployments_own_files_are_refused_whatever_the_roots_say(tmp_path, settings):
    settings.PI_SKILLS_ROOTS = ("/",)
    for source in (Path(django_settings.BASE_DIR) / "pidispatch_site", django_settings.VAR_DIR,
                   django_settings.PI_JOB_ROOT, folder_roots.CONFIG_DIR, Path("/proc/self"), Path("/sys"),
                   Path("/"), Path(django_settings.BASE_DIR).parent):
        judged = folder_roots.judge(str(source), folder_roots.SKILLS)
        assert judged.why == folder_roots.DEPLOYMENT_FILES, source
        if source.is_dir():
            assert refused(source, tmp_path / "copy").reason == "skills-dir-not-allowed"
    assert not (tmp_path / "copy").exists()


# --- how it is read: as any user may, never through a link swapped in -------------------------------------------------

@pytest.mark.parametrize("lock", ["folder", "subfolder", "file"])
def test_what_only_its_owner_may_read_is_refused_not_copied_wider(root, tmp_path, lock):
    source = root / "skills"
    skill(source, "deploy")
    secret = source / "deploy" / "keys.env"
    secret.write_text(f"ANTHROPIC_API_KEY={PROVIDER_KEY}\n")
    {"folder": lambda: source.chmod(0o700), "subfolder": lambda: (source / "deploy").chmod(0o700),
     "file": lambda: secret.chmod(0o600)}[lock]()

    assert refused(source, tmp_path / "copy").reason == "skills-dir-unreadable"
    assert PROVIDER_KEY.encode() not in copied_bytes(tmp_path / "copy")


def test_a_file_swapped_for_a_link_after_the_listing_is_never_followed(root, tmp_path, monkeypatch):
    secret = secrets_file(tmp_path / "outside")
    source = root / "skills"
    skill(source, "review")
    listed = repo_skills.select

    def swap_after_listing(*args, **kwargs):
        entries = listed(*args, **kwargs)
        (source / "review" / "SKILL.md").unlink()
        (source / "review" / "SKILL.md").symlink_to(secret)
        return entries

    monkeypatch.setattr(skills_folder.repo_skills, "select", swap_after_listing)
    assert refused(source, tmp_path / "copy").reason == "skills-dir-not-allowed"
    assert PROVIDER_KEY.encode() not in copied_bytes(tmp_path / "copy")


def test_a_folder_swapped_for_a_link_after_the_listing_is_never_followed(root, tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    secrets_file(outside / "review")
    (outside / "review" / "SKILL.md").write_text(f"ANTHROPIC_API_KEY={PROVIDER_KEY}\n")
    source = root / "skills"
    skill(source, "review")
    listed = repo_skills.select

    def swap_after_listing(*args, **kwargs):
        entries = listed(*args, **kwargs)
        (source / "review").rename(root / "moved")
        (source / "review").symlink_to(outside / "review")
        return entries

    monkeypatch.setattr(skills_folder.repo_skills, "select", swap_after_listing)
    assert refused(source, tmp_path / "copy").reason == "skills-dir-not-allowed"
    assert PROVIDER_KEY.encode() not in copied_bytes(tmp_path / "copy")


def test_the_folder_itself_swapped_for_a_link_after_it_was_judged_is_refused(root, tmp_path, monkeypatch):
    secrets_file(tmp_path / "outside")
    source = root / "skills"
    skill(source, "review")
    judge = folder_roots.judge

    def swap_after_judging(*args, **kwargs):
        judged = judge(*args, **kwargs)
        source.rename(root / "moved")
        source.symlink_to(tmp_path / "outside")
        return judged

    monkeypatch.setattr(skills_folder.folder_roots, "judge", swap_after_judging)
    assert refused(source, tmp_path / "copy").reason in ("skills-dir-not-allowed", "skills-dir-missing")
    assert PROVIDER_KEY.encode() not in copied_bytes(tmp_path / "copy")


def test_a_fifo_in_the_folder_is_skipped_never_read(root, tmp_path):
    import os

    source = root / "skills"
    skill(source, "review")
    os.mkfifo(source / "review" / "pipe")  # reading it would block the worker forever
    assert skills_folder.copy(str(source), tmp_path / "copy") == 1


# --- whole jobs: refused before they spend ----------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_job_whose_skills_folder_is_outside_the_roots_or_unreadable_is_refused_before_it_spends(
        repo, run_worker, skills_space, tmp_path):
    outside = tmp_path / "deployment"
    secrets_file(outside)
    locked = skills_space / "locked"
    skill(locked, "deploy")
    (locked / "deploy" / "keys.env").write_text(f"GITHUB_TOKEN={FORGE_TOKEN}\n")
    (locked / "deploy" / "keys.env").chmod(0o600)
    folders = {"skills-dir-not-allowed": outside, "skills-dir-unreadable": locked,
               "skills-dir-missing": skills_space / "absent"}
    jobs = {reason: enqueue_spec(local_spec(f"run-{reason}", str(repo), skills_dir=str(folder)))
            for reason, folder in folders.items()}

    result = run_worker("pi-jobs")

    for reason, job_id in jobs.items():
        run = Run.objects.get(job_id=job_id)
        assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, reason, False)
    assert PROVIDER_KEY not in result.stdout + result.stderr and FORGE_TOKEN not in result.stdout + result.stderr
