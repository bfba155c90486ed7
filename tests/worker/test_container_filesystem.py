"""What a job's container may write besides its workspace: nothing on the root filesystem (read-only), and /tmp and
its home only as far as PI_JOB_TMP_MB and PI_JOB_HOME_MB go (tmpfs: memory inside the container's limit, never the
host's disk). A real container of the demo image, driven by `fake-agent:` directives."""

from pathlib import Path

import pytest

from apps.worker.models import Outcome, Run
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

MIB = 1024 * 1024


def test_the_root_filesystem_is_read_only_and_tmp_is_bounded(run_worker, settings):
    job_id = enqueue_spec(forge_spec("gh-fs-bounds", body="fake-agent:write-probe fake-agent:fill-tmp-mb=32"))

    run_worker("pi-jobs", env_overrides={"PI_JOB_TMP_MB": "4", "PI_JOB_HOME_MB": "2"})

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED  # the runner itself needs no more
    workspace = Path(settings.PI_JOB_ROOT) / job_id / "workspace"
    answers = dict(line.split(" ", 1) for line in (workspace / "write-probe.txt").read_text().splitlines())
    for outside in ("/", "/etc", "/bin", "/usr"):
        assert "Read-only file system" in answers[outside], answers
    assert answers["/home/pi"] == answers["/tmp"] == answers["/workspace"] == "written"

    fill = dict(line.split(" ", 1) for line in (workspace / "tmp-fill.txt").read_text().splitlines())
    assert "No space left on device" in fill["error"]
    assert int(fill["bytes"]) <= 4 * MIB  # of the 32 MiB it tried
    assert fill["mount"].startswith("tmpfs /tmp tmpfs ") and "size=4096k" in fill["mount"]  # memory, not disk
