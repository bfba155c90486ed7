#!/usr/bin/env bash
# contrib/upgrade.sh <host>: upgrade one worker host of a running fleet without losing a job, in the order a
# rolling upgrade needs. Run it on the host, one host at a time; the other hosts keep working throughout.
#
#   1. drain the host (it takes no new job; its running jobs finish; waits up to PI_UPGRADE_DRAIN_WAIT seconds)
#   2. install the new version                       (PI_UPGRADE_INSTALL, default: git pull --ff-only, make install)
#   3. migrate the database, once for the fleet       (manage.py migrate_fleet: hosts take turns)
#   4. collect static files                          (hosts that serve the admin)
#   5. build the job image where its inputs changed   (make image: builds nothing when they did not)
#   6. restart the host's services                    (PI_UPGRADE_RESTART, default: systemctl restart pidispatch-*)
#   7. run doctor until it passes                    (up to PI_UPGRADE_DOCTOR_WAIT seconds)
#   8. undrain the host
#
# Migrations stay backward compatible for one release (tests/site/test_rolling_upgrade.py), so hosts still on
# the previous release keep working while the database is ahead of them. If a step fails the script stops there
# and the host stays drained: fix the cause and run it again, or roll back (docs/deploying.md, "Upgrading").
set -euo pipefail

host=${1:?usage: contrib/upgrade.sh <host name (PI_WORKER_NAME)>}
cd "$(dirname "$0")/.."
root=$PWD
python=${PI_UPGRADE_PYTHON:-$root/.venv/bin/python}
drain_wait=${PI_UPGRADE_DRAIN_WAIT:-3600}
doctor_wait=${PI_UPGRADE_DOCTOR_WAIT:-300}
install=${PI_UPGRADE_INSTALL:-git -C "$root" pull --ff-only && make -C "$root" install}
restart=${PI_UPGRADE_RESTART:-systemctl restart "pidispatch-worker@$host.service" && systemctl try-restart pidispatch-web.service pidispatch-edge.service pidispatch-replayer.service pidispatch-cron.service}

manage() { "$python" "$root/manage.py" "$@"; }
step() { echo "==> $host: $1"; }
failed() { echo "==> $host: FAILED at: $1. The host stays drained; fix the cause and run this again." >&2; }

step "draining (waiting up to ${drain_wait} s for its running jobs)"
manage fleet drain --host "$host" --wait "$drain_wait" --note "upgrade" --by "upgrade:$host" || { failed "drain"; exit 1; }

step "installing the new version"
bash -c "$install" || { failed "install"; exit 1; }

step "migrating the database (once for the fleet)"
manage migrate_fleet || { failed "migrate"; exit 1; }

step "collecting static files"
manage collectstatic --noinput -v 0 || { failed "collectstatic"; exit 1; }

if [ -z "${PI_UPGRADE_SKIP_IMAGE:-}" ]; then
    step "building the job image where its inputs changed"
    make -C "$root" image || { failed "make image"; exit 1; }
fi

step "restarting its services"
bash -c "$restart" || { failed "restart"; exit 1; }

step "running doctor until it passes (up to ${doctor_wait} s)"
deadline=$((SECONDS + doctor_wait))
until manage doctor >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        manage doctor || true
        failed "doctor"
        exit 1
    fi
    sleep 5
done

step "undraining"
manage fleet undrain --host "$host" --by "upgrade:$host"
echo "==> $host: upgraded"
