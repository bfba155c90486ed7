"""The job image: built the same way by both methods, labelled with what it speaks, and refused before any
spend when it was built for another runner protocol (or by hand, with no labels at all)."""

import re
from pathlib import Path

import docker
import pytest

from apps.worker.models import Outcome, Run
from apps.worker.sandbox import image_contract
from devtools import jobimage, services
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def dockerfile_arg(name: str) -> str:
    return re.search(rf"^ARG {name}=(\S+)$", jobimage.DOCKERFILE.read_text(), re.M).group(1)


def test_the_dockerfile_and_the_package_build_pin_the_same_versions():
    assert dockerfile_arg("PI_VERSION") == jobimage.PI_VERSION
    assert dockerfile_arg("NODE_VERSION") == jobimage.NODE_VERSION
    assert dockerfile_arg("RUNNER_PROTOCOL") == image_contract.RUNNER_PROTOCOL
    packages = re.search(r"--no-install-recommends ([^\\\n]+)", jobimage.DOCKERFILE.read_text()).group(1).split()
    assert tuple(packages) == jobimage.DEBIAN_PACKAGES


def test_the_built_image_carries_what_the_worker_checks():
    image = docker.from_env().images.get(__import__("os").environ["PI_REAL_JOB_IMAGE"])
    labels = image.labels
    assert image_contract.incompatibility(labels) is None
    assert labels[image_contract.PI_VERSION_LABEL] == jobimage.PI_VERSION
    assert labels[image_contract.INPUTS_LABEL] == jobimage.inputs_hash()
    assert labels[image_contract.RUNNER_SHA_LABEL] == jobimage.runner_sha()
    config = image.attrs["Config"]
    assert config["User"] == "1000:1000" and config["WorkingDir"] == "/workspace"
    assert config["Entrypoint"] == ["node", "/opt/pi-runner/runner.mjs"]


def test_a_new_runner_is_a_new_image(tmp_path, monkeypatch):
    before = jobimage.inputs_hash()
    changed = tmp_path / "runner.mjs"
    changed.write_text(jobimage.RUNNER.read_text() + "\n// changed\n")
    monkeypatch.setattr(jobimage, "RUNNER", changed)
    assert jobimage.inputs_hash() != before


@pytest.fixture
def image_with_labels():
    engine = docker.from_env()
    made = []

    def make(tag: str, labels: dict):
        changes = ["USER 1000:1000", 'ENTRYPOINT ["/usr/local/bin/pi-runner"]', "ENV PATH=/bin:/usr/local/bin"]
        changes += [f"LABEL {key}={value}" for key, value in labels.items()]
        engine.api.import_image_from_data(services.build_rootfs(services.static_busybox()), repository=tag,
                                          tag="latest", changes=changes)
        made.append(f"{tag}:latest")
        return f"{tag}:latest"

    yield make
    for tag in made:
        engine.images.remove(tag, force=True)


@pytest.mark.parametrize("labels, reason", [
    ({}, "job-image-unlabelled"),
    ({image_contract.PROTOCOL_LABEL: "1", image_contract.PI_VERSION_LABEL: "0.60.0"}, "job-image-protocol-mismatch"),
])
def test_an_image_not_built_for_this_worker_is_refused_before_spend(labels, reason, image_with_labels, run_worker,
                                                                    settings):
    image = image_with_labels(f"pidispatch-test-{reason}", labels)
    job_id = enqueue_spec(forge_spec(f"gh-{reason}", image=image))

    result = run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, reason, False)
    assert f"reason={reason}" in result.stderr + result.stdout
    assert not (Path(settings.PI_JOB_ROOT) / job_id).exists()  # refused before its workspace was made
