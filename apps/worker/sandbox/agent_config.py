"""The `models.json` that points pi inside the container at its gateway (PI_CODING_AGENT_DIR=/job/pi-agent).

A built-in provider keeps pi's own models and API adapter and only has its base URL moved to the runner's
loopback forwarder (pi's "Overriding Built-in Providers"); any other provider is declared with its API kind
and the job's model. Either way the key pi holds is a placeholder: the gateway drops it and adds the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

from apps.worker.sandbox import image_contract, prices
from apps.worker.sandbox.gateway import PLACEHOLDER_KEY
from apps.worker.sandbox.providers import Upstream

AGENT_FOLDER = "pi-agent"  # under the job's /job folder


def models_document(upstream: Upstream, model: str, allowed: tuple[str, ...] = ()) -> dict:
    """`allowed`: the provider's model ids on the job's allowed-model list; pi must know each to choose it."""
    entry = {"baseUrl": f"http://127.0.0.1:{image_contract.PROVIDER_PORT}{upstream.path}", "apiKey": PLACEHOLDER_KEY}
    if not upstream.builtin:
        entry["api"] = upstream.api
    declared = []
    for each in (model, *allowed):
        if each and each.lower() not in {known.lower() for known in declared} \
                and not (upstream.builtin and prices.is_listed(upstream.provider, each)):
            declared.append(each)
    if declared:
        entry["models"] = [{"id": each} for each in declared]
        if upstream.builtin:
            entry["api"] = upstream.api
    return {"providers": {upstream.provider: entry}}


def write(job_folder: Path, upstream: Upstream, model: str, allowed: tuple[str, ...] = ()) -> Path:
    folder = job_folder / AGENT_FOLDER
    folder.mkdir(mode=0o755, exist_ok=True)
    folder.chmod(0o755)
    path = folder / "models.json"
    path.write_text(json.dumps(models_document(upstream, model, allowed), indent=2) + "\n")
    path.chmod(0o644)
    return path
