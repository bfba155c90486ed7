"""Name patterns shared by everything that builds jobs (triggers, manual runs, the API): flow, image, provider,
model."""

import re

# A pi skill name: lowercase letters, digits, '-' and '_', 1-64 chars, alphanumeric at both ends.
FLOW_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?$")
# An image reference as docker accepts it, never starting with '-' (it would read as a flag).
IMAGE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
# A provider and a model as a trigger's `run` or a manual run names them (pi's own names, or patterns).
PROVIDER_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MODEL_PATTERN = re.compile(r"^(?:[~@]?[A-Za-z0-9])[A-Za-z0-9._:/@-]{0,62}$")
