#!/usr/bin/env bash
# contrib/upgrade.sh <host> <release tag>: upgrade one host of a running fleet to a named release without losing a
# job, in the order a rolling upgrade needs. Run it as root on the host (the checkout is root's, as
# docs/deploying.md sets it up), one host at a time; the other hosts keep working throughout.
#
#   1. drain the host (it takes no new job; its running jobs finish; waits up to PI_UPGRADE_DRAIN_WAIT seconds)
#   2. install the release                           (PI_UPGRADE_INSTALL, default: git fetch --tags, git checkout
#                                                     --detach <release>, make install)
#   3. migrate the database, once for the fleet       (manage.py migrate_fleet: hosts take turns)
#   4. collect static files                          (hosts that serve the admin)
#   5. build the job image where its inputs changed   (make image: builds nothing when they did not)
#   6. restart every pidispatch unit the host runs    (PI_UPGRADE_RESTART, default: systemctl restart of each
#                                                     loaded pidispatch-* service: workers, cron, web, edge,
#                                                     replayer, poller, notify)
#   7. run doctor until it passes                    (up to PI_UPGRADE_DOCTOR_WAIT seconds)
#   8. undrain the host
#
# manage.py runs as the service user (PI_UPGRADE_USER, default pidispatch: the guide's `runuser -u pidispatch`),
# never as root. Migrations stay backward compatible for one release (tests/site/test_rolling_upgrade.py), so hosts
# still on the previous release keep working while the database is ahead of them. If a step fails the script
# stops there, undrains the host (its services still run what they ran, or the release when the restart was
# reached) and says which step failed: fix the cause and run it again, or roll back (docs/deploying.md).
set -euo pipefail

usage="usage: contrib/upgrade.sh <host name (PI_WORKER_NAME)> <release tag (CHANGELOG.md's versions)>"
host=${1:?$usage}
release=${2:?$usage}
cd "$(dirname "$0")/.."
root=$PWD
python=${PI_UPGRADE_PYTHON:-$root/.venv/bin/python}
drain_wait=${PI_UPGRADE_DRAIN_WAIT:-3600}
doctor_wait=${PI_UPGRADE_DOCTOR_WAIT:-300}
service_user=${PI_UPGRADE_USER-pidispatch}
install=${PI_UPGRADE_INSTALL:-git -C "$root" fetch --tags --quiet && git -C "$root" -c advice.detachedHead=false checkout --detach "refs/tags/$release" && make -C "$root" install}
restart=${PI_UPGRADE_RESTART:-}

step() { echo "==> $host: $1"; }

manage() {
    if [ "$(id -u)" = 0 ] && [ -n "$service_user" ] && [ "$service_user" != root ]; then
        runuser -u "$service_user" -- "$python" "$root/manage.py" "$@"
    else
        "$python" "$root/manage.py" "$@"
    fi
}

drained=""
at="start"
on_exit() {
    local status=$?
    if [ "$status" -ne 0 ]; then
        echo "==> $host: FAILED at: $at (exit $status)." >&2
        if [ -n "$drained" ]; then
            if manage fleet undrain --host "$host" --by "upgrade:$host"; then
                echo "==> $host: undrained again; fix the cause and run this again." >&2
            else
                echo "==> $host: could not undrain it: run \`pidispatch fleet undrain --host $host\`." >&2
            fi
        fi
    fi
}
trap on_exit EXIT

restart_units() {
    if [ -n "$restart" ]; then
        bash -c "$restart"
        return
    fi
    # Every pidispatch service this host has loaded, templates' instances included (pidispatch-worker@<name>,
    # pidispatch-cron@<name>): a unit this host does not run is not loaded, so it is not started here.
    local units
    mapfile -t units < <(systemctl list-units --type=service --all --plain --no-legend 'pidispatch-*' \
        | awk '{print $1}' | grep -v '@\.service$' || true)
    if [ "${#units[@]}" -eq 0 ]; then
        echo "no pidispatch unit is loaded on this host (systemctl list-units 'pidispatch-*')" >&2
        return 1
    fi
    echo "restarting: ${units[*]}"
    systemctl restart "${units[@]}"
}

at="the release $release"
if [ -z "${PI_UPGRADE_INSTALL:-}" ] && ! git -C "$root" rev-parse -q --verify "refs/tags/$release" >/dev/null; then
    git -C "$root" fetch --tags --quiet
    git -C "$root" rev-parse -q --verify "refs/tags/$release" >/dev/null \
        || { echo "no release tag $release in $root (git tag -l)" >&2; exit 1; }
fi

at="drain"
step "draining (waiting up to ${drain_wait} s for its running jobs)"
drained=1  # a drain that fails part way is undone too
manage fleet drain --host "$host" --wait "$drain_wait" --note "upgrade to $release" --by "upgrade:$host"

at="install"
step "installing $release"
bash -c "$install"

at="migrate"
step "migrating the database (once for the fleet)"
manage migrate_fleet

at="collectstatic"
step "collecting static files"
manage collectstatic --noinput -v 0

if [ -z "${PI_UPGRADE_SKIP_IMAGE:-}" ]; then
    at="make image"
    step "building the job image where its inputs changed"
    make -C "$root" image
fi

at="restart"
step "restarting its services"
restart_units

at="doctor"
step "running doctor until it passes (up to ${doctor_wait} s)"
deadline=$((SECONDS + doctor_wait))
until manage doctor >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        manage doctor || true
        exit 1
    fi
    sleep 5
done

at="undrain"
step "undraining"
manage fleet undrain --host "$host" --by "upgrade:$host"
drained=""
echo "==> $host: upgraded to $release"
