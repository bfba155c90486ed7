"""Running git for the worker: no system or global config, no credential helpers, no prompts, English
messages, and of the worker's environment only what reaching a forge needs. A token, when one is needed,
travels as an HTTP header in git's environment: never in an argv (`ps` shows those), a URL or a config file.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

PASSED_THROUGH = ("PATH", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
                  "GIT_SSL_CAINFO", "SSL_CERT_FILE", "SSL_CERT_DIR")


def run_git(folder: Path, *args: str, timeout: float, authorization: str = "",
            stdin: bytes | None = None, as_user: tuple[int, int] | None = None,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`git -C folder args...` with bytes in and out, optionally as another uid:gid. `extra_env` adds what
    one call needs (an author identity, an index file). Raises subprocess.TimeoutExpired and OSError."""
    environment = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    environment.update(extra_env or {})
    environment.update({
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "LC_ALL": "C",  # callers classify stderr by its words
    })
    if authorization:
        environment.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                            "GIT_CONFIG_VALUE_0": f"Authorization: {authorization}"})
    # safe.directory: a root worker works in a folder that already belongs to the job's user. No redirects
    # (the header would follow them to another host) and no transport but HTTP(S) (no ext::, file://, ssh).
    # core.fsmonitor names a program git would run: a folder's own config must never make git run one.
    command = ["git", "-c", f"safe.directory={folder}", "-c", "credential.helper=", "-c", "protocol.version=2",
               "-c", "http.followRedirects=false", "-c", "protocol.allow=never", "-c", "protocol.https.allow=always",
               "-c", "protocol.http.allow=always", "-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}",
               "-C", str(folder), *args]
    user = {"user": as_user[0], "group": as_user[1], "extra_groups": []} if as_user and os.geteuid() == 0 else {}
    return subprocess.run(command, env=environment, input=stdin, capture_output=True, timeout=timeout,
                          stdin=None if stdin is not None else subprocess.DEVNULL, **user)
