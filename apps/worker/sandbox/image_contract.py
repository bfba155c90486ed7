"""What a job image must declare to be run: labels the image build writes and the worker's preflight reads.

No Django here: the image builder (devtools/jobimage.py) imports it on a machine that may have none set up.
The runner protocol is the contract between the worker and image/runner/runner.mjs (its RUNNER_PROTOCOL):
what the container's environment, /job files and egress forwarder look like, and what its exit line says.
A worker runs only images built for its own protocol.
"""

from __future__ import annotations

RUNNER_PROTOCOL = "3"

PI_VERSION_LABEL = "dev.pi-dispatch.pi-version"
PROTOCOL_LABEL = "dev.pi-dispatch.runner-protocol"
RUNNER_SHA_LABEL = "dev.pi-dispatch.runner-sha"
INPUTS_LABEL = "dev.pi-dispatch.inputs"  # the hash of everything the image was built from (the build cache key)

# Inside the container: the runner's forwarders listen on loopback and pipe to the gateway's sockets,
# which the worker bind-mounts read-only at these paths.
PROVIDER_SOCKET = "/run/pi-egress/provider.sock"
PROXY_SOCKET = "/run/pi-egress/proxy.sock"
PROVIDER_PORT = 8080
PROXY_PORT = 3128
AGENT_DIR = "/job/pi-agent"  # PI_CODING_AGENT_DIR: the models.json that points pi at its gateway


def incompatibility(labels: dict[str, str] | None) -> str | None:
    """Why an image with these labels cannot run a job (a reason token), or None when it can."""
    labels = labels or {}
    if not labels.get(PROTOCOL_LABEL) or not labels.get(PI_VERSION_LABEL):
        return "job-image-unlabelled"
    if labels[PROTOCOL_LABEL] != RUNNER_PROTOCOL:
        return "job-image-protocol-mismatch"
    return None
