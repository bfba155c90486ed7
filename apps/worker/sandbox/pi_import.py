"""Staging the operator's own pi setup into the host's overlay (`manage.py import_pi`), never their keys.

    report = stage(Path("~/.pi/agent").expanduser(), Path(settings.PI_GLOBAL_PI_DIR))
    report.staged     # overlay paths written
    report.refused    # (source path, why) never copied

What is staged (apps/worker/sandbox/pi_overlay.py says how a job loads it): `skills/`, `prompts/`, `extensions/`,
the persona (`AGENTS.md`, `APPEND_SYSTEM.md`), `models.json` with its credentials taken out (every job can read
the overlay, though the worker writes the models.json pi uses; it is kept so the operator's model list travels
with the overlay): each provider's and model's `apiKey` and `headers`, the user info, query and fragment of every
`baseUrl` (`https://user:pass@host/v1?api-key=...`), and any field pi's models.json schema does not have, each
named in the report; and each package settings.json names by a local path, into `packages/<name>/`. npm and git
package sources are not fetched (nothing here downloads code): stage a local copy of one to use it.

Never staged: `auth.json` (it holds keys), `sessions/`, `settings.json`, anything else; and any file whose text
holds something shaped like a credential (KEY_PATTERNS) is refused whole and named, so a key pasted into a skill
never reaches a job. Links are not followed. The overlay's folders are replaced whole: what was staged before
and is gone from the source goes too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

FOLDERS = ("skills", "prompts", "extensions")
FILES = ("AGENTS.md", "APPEND_SYSTEM.md")
NEVER = {"auth.json": "holds the provider keys pi logged in with", "sessions": "your own conversations",
         "settings.json": "your interactive settings (a job gets its own)"}
# pi's models.json schema (pi-coding-agent's model-registry): what each level may hold. `apiKey` and `headers`
# hold credentials and are always taken out; a field pi does not know is taken out too (it may hold anything).
PROVIDER_FIELDS = frozenset({"name", "baseUrl", "api", "compat", "authHeader", "models", "modelOverrides"})
MODEL_FIELDS = frozenset({"id", "name", "api", "baseUrl", "reasoning", "thinkingLevelMap", "input", "cost",
                          "contextWindow", "maxTokens", "compat"})
OVERRIDE_FIELDS = MODEL_FIELDS - {"id", "api", "baseUrl"}
MAX_FILE_BYTES = 8 * 1024 * 1024
# Shapes of credentials a file must not hold: provider and forge keys, cloud keys, private keys, bearer tokens.
KEY_PATTERNS = tuple(re.compile(pattern) for pattern in (
    r"sk-ant-[A-Za-z0-9_-]{16,}", r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}", r"\bgh[pousr]_[A-Za-z0-9]{30,}",
    r"\bgithub_pat_[A-Za-z0-9_]{30,}", r"\bglpat-[A-Za-z0-9_-]{20,}", r"\bAKIA[0-9A-Z]{16}\b",
    r"\bAIza[0-9A-Za-z_-]{35}\b", r"\bxox[abprs]-[A-Za-z0-9-]{10,}", r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{20,}",
))


class ImportRefused(Exception):
    """The source or the destination cannot be used at all."""


@dataclass
class Report:
    staged: list[str] = field(default_factory=list)
    stripped: list[str] = field(default_factory=list)  # what was taken out of a staged file
    refused: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def holds_key(data: bytes) -> bool:
    text = data.decode("utf-8", errors="replace")
    return any(pattern.search(text) for pattern in KEY_PATTERNS)


def stage(source: Path, overlay: Path) -> Report:
    if not source.is_dir():
        raise ImportRefused(f"{source} is not a folder (pi's agent folder is ~/.pi/agent)")
    if not overlay.is_absolute():
        raise ImportRefused("the overlay must be an absolute folder (PI_GLOBAL_PI_DIR or --to)")
    if overlay.resolve() == source.resolve() or source.resolve() in overlay.resolve().parents:
        raise ImportRefused("the overlay cannot be inside the folder it is staged from")
    overlay.mkdir(parents=True, exist_ok=True, mode=0o755)
    overlay.chmod(0o755)
    report = Report()
    for name, why in NEVER.items():
        if os.path.lexists(source / name):
            report.skipped.append((name, why))
    for name in FOLDERS:
        if (source / name).is_dir() and not (source / name).is_symlink():
            _replace_folder(source / name, overlay / name, name, report)
    for name in FILES:
        _copy_file(source / name, overlay / name, name, report)
    _stage_models(source / "models.json", overlay / "models.json", report)
    _stage_packages(source, overlay, report)
    return report


def _replace_folder(source: Path, destination: Path, label: str, report: Report) -> None:
    staging = destination.with_name(f".{destination.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o755)
    for folder, folders, files in os.walk(source, followlinks=False):
        relative = Path(folder).relative_to(source)
        folders[:] = [name for name in folders if not name.startswith(".")]  # .git and friends stay home
        (staging / relative).mkdir(exist_ok=True, mode=0o755)
        for name in files:
            _copy_file(Path(folder) / name, staging / relative / name, str(Path(label) / relative / name), report,
                       quiet=True)
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)
    report.staged.append(label + "/")


def _copy_file(source: Path, destination: Path, label: str, report: Report, quiet: bool = False) -> None:
    try:
        info = source.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        report.skipped.append((label, "not a regular file (links are not followed)"))
        return
    if info.st_size > MAX_FILE_BYTES:
        report.refused.append((label, "larger than 8 MiB"))
        return
    data = source.read_bytes()
    if holds_key(data):
        report.refused.append((label, "holds something shaped like a credential"))
        return
    destination.write_bytes(data)
    destination.chmod(0o755 if info.st_mode & 0o111 and label.startswith(("extensions/", "packages/")) else 0o644)
    if not quiet:
        report.staged.append(label)


def _stage_models(source: Path, destination: Path, report: Report) -> None:
    try:
        document = json.loads(source.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        report.refused.append(("models.json", "not readable JSON"))
        return
    if not isinstance(document, dict) or not isinstance(document.get("providers"), dict):
        report.refused.append(("models.json", "not pi's shape ({\"providers\": {...}})"))
        return
    for key in set(document) - {"providers"}:
        del document[key]
        report.stripped.append(f"models.json: {key} (not a field of pi's models.json)")
    for name, entry in document["providers"].items():
        if not isinstance(entry, dict):
            continue
        where = f"providers.{name}"
        _keep_only(entry, PROVIDER_FIELDS, where, report)
        for index, model in enumerate(entry.get("models") or [] if isinstance(entry.get("models"), list) else []):
            if isinstance(model, dict):
                label = model.get("id") if isinstance(model.get("id"), str) and model.get("id") else index
                _keep_only(model, MODEL_FIELDS, f"{where}.models[{label}]", report)
        overrides = entry.get("modelOverrides")
        for model_id, override in overrides.items() if isinstance(overrides, dict) else ():
            if isinstance(override, dict):
                _keep_only(override, OVERRIDE_FIELDS, f"{where}.modelOverrides[{model_id}]", report)
    data = (json.dumps(document, indent=2) + "\n").encode()
    if holds_key(data):
        report.refused.append(("models.json", "still holds something shaped like a credential after its apiKey "
                                              "and headers were taken out"))
        return
    destination.write_bytes(data)
    destination.chmod(0o644)
    report.staged.append("models.json")


def _keep_only(entry: dict, known: frozenset, where: str, report: Report) -> None:
    """`entry` without its credentials and without what pi does not know, each removal named in the report."""
    for key in sorted(set(entry) - known):
        del entry[key]
        why = "" if key in ("apiKey", "headers") else " (not a field pi knows here)"
        report.stripped.append(f"models.json: {where}.{key}{why}")
    url = entry.get("baseUrl")
    if isinstance(url, str):
        clean, removed = _without_credentials(url)
        if removed:
            entry["baseUrl"] = clean
            report.stripped.append(f"models.json: {where}.baseUrl's {' and '.join(removed)}")


def _without_credentials(url: str) -> tuple[str, list[str]]:
    """The URL without the parts that carry credentials (user info, query, fragment), and which were there."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "", ["unparseable value"]
    removed = [name for name, present in (("user info", "@" in parts.netloc), ("query", bool(parts.query)),
                                          ("fragment", bool(parts.fragment))) if present]
    if not removed:
        return url, []
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")), removed


def _stage_packages(source: Path, overlay: Path, report: Report) -> None:
    try:
        packages = json.loads((source / "settings.json").read_text()).get("packages") or []
    except (OSError, ValueError, AttributeError):
        packages = []
    kept = set()
    for entry in packages:
        spec = entry.get("source") if isinstance(entry, dict) else entry
        if not isinstance(spec, str) or not spec:
            continue
        if spec.startswith(("npm:", "git:", "http://", "https://", "ssh://", "git@")) or not spec.startswith(
                ("/", "./", "../", "~")):
            report.skipped.append((f"package {spec}", "not a local folder: stage a local copy of it (nothing is "
                                                      "downloaded)"))
            continue
        folder = (source / Path(spec).expanduser()).resolve() if not spec.startswith("/") else Path(spec)
        name = re.sub(r"[^A-Za-z0-9._-]", "-", folder.name).lstrip(".") or "package"
        if not folder.is_dir() or name in kept:
            why = "not a folder" if not folder.is_dir() else f"a second package named {name}"
            report.skipped.append((f"package {spec}", why))
            continue
        kept.add(name)
        (overlay / "packages").mkdir(exist_ok=True, mode=0o755)
        _replace_folder(folder, overlay / "packages" / name, f"packages/{name}", report)
    if (overlay / "packages").is_dir():
        for stale in os.scandir(overlay / "packages"):
            if stale.name not in kept and not stale.name.startswith("."):
                shutil.rmtree(stale.path, ignore_errors=True)
