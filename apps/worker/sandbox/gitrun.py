"""Running git for the worker: the one runner of every git the worker starts, much of it on trees the agent
wrote (its clone and `.git`, a local job's folder), so each call is closed against what such a tree could ask:

- no system or global config, HOME nowhere, no credential helper, no prompt, English messages, and of the
  worker's environment only what reaching a forge needs;
- `GIT_NO_LAZY_FETCH=1`: a repository that calls itself a partial clone never makes git fetch "missing" objects
  from the remote its config names (that remote could be `ext::<any command>`);
- no transport but the one a call names (`transport`): HTTP(S) for a forge, `file` for a folder or bundle on
  this host, none otherwise; `GIT_PROTOCOL_FROM_USER=0` besides; no redirects;
- fsmonitor, hooks and ssh commands off.

Where git reads a repository's own config in a process of its own (the upload-pack of a fetch from the agent's
clone), the `-c` settings here do not reach it: `unsafe_settings` names what such a config may not hold, and the
callers refuse it first. The environment does reach it, but only a git fixed against lazy fetching honours
GIT_NO_LAZY_FETCH (CVE-2024-32004, CVE-2024-32465): `git_problem` names an older one, on which the worker does not
start (and `doctor` fails).

A token, when one is needed, travels as an HTTP header in git's environment: never in an argv (`ps` shows
those), a URL or a config file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

PRLIMIT = shutil.which("prlimit")  # util-linux (Debian's essential set); a host without it: a settings warning

PASSED_THROUGH = ("PATH", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                  "GIT_SSL_CAINFO", "SSL_CERT_FILE", "SSL_CERT_DIR")
CLOSED_ENVIRONMENT = {
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_PROTOCOL_FROM_USER": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "/bin/false",
    "LC_ALL": "C",  # callers classify stderr by its words
}
# What each kind of call may reach: everything else is `protocol.allow=never` (ext::, ssh, git://, ...).
TRANSPORTS = {"none": (), "http": ("https", "http"), "file": ("file",)}

# Keys (lowercased) of a repository's own configuration that make git run a program, read configuration from
# another file, work on another tree, or fetch missing objects from a remote.
UNSAFE_CONFIG = re.compile(r"filter\..+|include\..+|includeif\..+|core\.worktree|extensions\.partialclone"
                           r"|core\.fsmonitor|extensions\.worktreeconfig|remote\..+\.promisor")
# Of those, the switches that are harmless when off (git's false: "false", "no", "off", "0" or empty).
SWITCHES = re.compile(r"core\.fsmonitor|extensions\.worktreeconfig|remote\..+\.promisor")
OFF = {"false", "no", "off", "0", ""}

# git fixed lazy fetching in upload-pack (and honours GIT_NO_LAZY_FETCH) from these releases of each maintenance
# line; every line after the last has it.
FIXED_RELEASES = {(2, 39): 4, (2, 40): 2, (2, 41): 1, (2, 42): 2, (2, 43): 4, (2, 44): 1, (2, 45): 1}
VERSION = re.compile(r"^git version (\d+)\.(\d+)(?:\.(\d+))?")


def run_git(folder: Path, *args: str, timeout: float, authorization: str = "", transport: str = "none",
            stdin: bytes | None = None, as_user: tuple[int, int] | None = None,
            extra_env: dict[str, str] | None = None, memory_mb: int = 0) -> subprocess.CompletedProcess:
    """`git -C folder args...` with bytes in and out, optionally as another uid:gid. `transport` is what the call
    may reach (TRANSPORTS); `extra_env` adds what one call needs (an author identity, an index file); `memory_mb`
    bounds its heap. Raises subprocess.TimeoutExpired and OSError."""
    command, environment = git_command(folder, *args, authorization=authorization, transport=transport,
                                       extra_env=extra_env, memory_mb=memory_mb)
    user = {"user": as_user[0], "group": as_user[1], "extra_groups": []} if as_user and os.geteuid() == 0 else {}
    return subprocess.run(command, env=environment, input=stdin, capture_output=True, timeout=timeout,
                          stdin=None if stdin is not None else subprocess.DEVNULL, **user)


def git_command(folder: Path, *args: str, authorization: str = "", transport: str = "none",
                extra_env: dict[str, str] | None = None, memory_mb: int = 0) -> tuple[list[str], dict[str, str]]:
    """The hardened command line and environment of run_git, for a caller that talks to git as it runs (a
    `cat-file --batch`). `memory_mb`: git's heap (RLIMIT_DATA, through util-linux's prlimit), so one git
    process cannot take the host's memory (an index of ten million paths is gigabytes); its packs are mapped
    files and do not count."""
    environment = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    environment.update(extra_env or {})
    environment.update(CLOSED_ENVIRONMENT)
    if authorization:
        environment.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                            "GIT_CONFIG_VALUE_0": f"Authorization: {authorization}"})
    # safe.directory: a root worker works in a folder that already belongs to the job's user. No redirects
    # (the header would follow them to another host). core.fsmonitor and core.sshCommand name programs git
    # would run: a folder's own config must never make git run one.
    allowed = [argument for scheme in TRANSPORTS[transport] for argument in ("-c", f"protocol.{scheme}.allow=always")]
    command = ["git", "-c", f"safe.directory={folder}", "-c", "credential.helper=", "-c", "protocol.version=2",
               "-c", "http.followRedirects=false", "-c", "protocol.allow=never", *allowed,
               "-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}", "-c", "core.sshCommand=false",
               "-c", "fetch.recurseSubmodules=false", "-C", str(folder), *args]
    if memory_mb and PRLIMIT:
        command = [PRLIMIT, f"--data={memory_mb * 1024 * 1024}", "--", *command]
    return command, environment


def unsafe_settings(entries: Iterable[tuple[str, str, str | None]], unsafe: re.Pattern = UNSAFE_CONFIG) -> list[str]:
    """`key (file)` of each (origin, lowercased key, value) setting `unsafe` names, so the operator knows what to
    remove from where. A key written without `=` has no value (a switch that is then on)."""
    return sorted({
        f"{key} ({origin.removeprefix('file:')})" for origin, key, value in entries
        if unsafe.fullmatch(key)
        and not (SWITCHES.fullmatch(key) and value is not None and value.strip().lower() in OFF)
    })


# --- the git on this host ------------------------------------------------------------------------------------

def git_problem(version_output: str) -> tuple[str, str] | None:
    """(what is wrong, what to install) for the git whose `git --version` printed this; None when it is fixed
    against lazy fetching from a repository's config."""
    found = VERSION.match(version_output.strip())
    if not found:
        return (f"cannot tell which git this is (`git --version` said {version_output.strip()[:80]!r})",
                "git from the operating system's packages")
    major, minor, patch = (int(part or 0) for part in found.groups())
    line = (major, minor)
    if line > max(FIXED_RELEASES) or patch >= FIXED_RELEASES.get(line, patch + 1):
        return None
    if line in FIXED_RELEASES:
        fix = f"git {major}.{minor}.{FIXED_RELEASES[line]} or later"
    else:
        releases = ", ".join(f"{a}.{b}.{fixed}" for (a, b), fixed in FIXED_RELEASES.items())
        fix = f"a fixed git ({releases} or later on its line, or any later line)"
    return (f"git {major}.{minor}.{patch} lets a repository the agent wrote make the worker's git fetch lazily "
            "through a remote its config names, which can run any command (CVE-2024-32004, CVE-2024-32465)", fix)


def git_version() -> str:
    """`git --version` of the git on PATH, run as the worker runs git. Raises OSError when there is none."""
    environment = {"PATH": os.environ.get("PATH", os.defpath), **CLOSED_ENVIRONMENT}
    result = subprocess.run(["git", "--version"], env=environment, capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    return result.stdout.strip() or result.stderr.strip()


def require_safe_git() -> None:
    """ImproperlyConfigured when this host has no git, or one too old to run in the agent's repositories."""
    try:
        problem = git_problem(git_version())
    except (OSError, subprocess.TimeoutExpired) as error:
        problem = (f"git does not run on this host ({type(error).__name__})", "git 2.39.4 or later")
    if problem:
        raise ImproperlyConfigured(f"{problem[0]}: install {problem[1]}")
