"""Write apps/worker/sandbox/pi_registry.json from the pinned pi's own model registry.

The egress gateway forwards a job's provider calls to the provider's real endpoint and prices what they
used. Both facts come from the pi version the image pins (devtools/jobimage.py PI_VERSION), so the gateway
agrees with what pi itself would call and charge: per provider its API kind, base URL and key variable;
per model its list prices in dollars per million tokens. Re-run it when PI_VERSION changes (needs npm):

    python -m devtools.pi_registry [--pi-version 0.73.1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import tempfile
from pathlib import Path

from .jobimage import PI_VERSION

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "apps" / "worker" / "sandbox" / "pi_registry.json"
# The provider APIs whose responses the gateway can meter (apps/worker/sandbox/metering.py).
METERED_APIS = ("anthropic-messages", "openai-completions", "openai-responses", "google-generative-ai")

DUMP = r"""
const ai = await import(process.argv[1] + "/dist/models.generated.js");
const providers = {};
for (const [name, models] of Object.entries(ai.MODELS)) {
  const list = Object.values(models);
  const endpoints = new Set(list.map((m) => `${m.api} ${m.baseUrl}`));
  providers[name] = {
    endpoints: [...endpoints],
    models: Object.fromEntries(list.map((m) => [m.id, m.cost])),
  };
}
console.log(JSON.stringify(providers));
"""


def key_variables(pi_ai: Path) -> dict[str, str]:
    """pi-ai keeps its provider -> variable table inside a function; read the map literal from its source."""
    source = (pi_ai / "dist" / "env-api-keys.js").read_text()
    start = source.index("const envMap = {")
    table = source[start:source.index("};", start)]
    pairs = {}
    for line in table.splitlines()[1:]:
        line = line.strip().rstrip(",")
        if ":" in line and not line.startswith("//"):
            name, _, variable = line.partition(":")
            pairs[name.strip().strip('"')] = variable.strip().strip('"')
    pairs.setdefault("anthropic", "ANTHROPIC_API_KEY")  # pi checks its OAuth token first; jobs use the key
    return pairs


def generate(pi_version: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="pi-registry-") as scratch:
        subprocess.run(["npm", "install", "--silent", "--prefix", scratch,
                        f"@mariozechner/pi-coding-agent@{pi_version}"], check=True)
        pi_ai = Path(scratch) / "node_modules" / "@mariozechner" / "pi-ai"
        dumped = json.loads(subprocess.run(["node", "--input-type=module", "-e", DUMP, str(pi_ai)], check=True,
                                           capture_output=True, text=True).stdout)
        variables = key_variables(pi_ai)
    providers = {}
    for name, entry in sorted(dumped.items()):
        if len(entry["endpoints"]) != 1:
            continue  # one provider, several APIs or hosts: not one upstream the gateway could stand for
        api, _, base_url = entry["endpoints"][0].partition(" ")
        if api not in METERED_APIS or "{" in base_url or not base_url.startswith("https://"):
            continue
        if name not in variables:
            continue
        providers[name] = {
            "api": api,
            "baseUrl": base_url,
            "keyVariable": variables[name],
            "prices": {model: {key: cost.get(key, 0) for key in ("input", "output", "cacheRead", "cacheWrite")}
                       for model, cost in sorted(entry["models"].items())},
        }
    return {"piVersion": pi_version, "generated": datetime.date.today().isoformat(),
            "pricesUnit": "USD per million tokens", "providers": providers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pi-version", default=PI_VERSION)
    registry = generate(parser.parse_args().pi_version)
    OUT.write_text(json.dumps(registry, indent=1, sort_keys=True) + "\n")
    print(f"==> {OUT.relative_to(ROOT)}: {len(registry['providers'])} providers, "
          f"{sum(len(p['prices']) for p in registry['providers'].values())} priced models")


if __name__ == "__main__":
    main()
