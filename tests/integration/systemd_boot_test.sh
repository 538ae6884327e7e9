#!/bin/sh
# The units under a real systemd: a Debian 12 root (debootstrapped once, then cached) gets the
# project installed as the README's "Deploying on a cluster" says, boots under systemd-nspawn,
# and an operator's steps are checked: the daemon is active through sd_notify, two workers and
# an evaluator train the example job to done, a SIGKILLed daemon is restarted and resumes, a
# SIGSTOPped one is restarted by the watchdog, `systemctl reload` returns after the reload, a
# checkpoint folder outside the state folder is refused at submit (and accepted once a drop-in
# allows it), and a worker whose server name does not resolve fails for good.
# Usage: OMNIVORE_BOOT_TEST=1 systemd_boot_test.sh SOURCE_ROOT BUILD_ROOT    (77 = skipped)
# Root only. OMNIVORE_BOOT_CACHE (default /var/cache/omnivore-boot-root) keeps the base root;
# OMNIVORE_BOOT_MIRROR (default: the first Debian archive in /etc/apt) is where it comes from.
set -eu
src=$1 build=$2

skip() { echo "systemd_boot: skipped: $*"; exit 77; }
[ "${OMNIVORE_BOOT_TEST:-0}" = 1 ] ||
    skip "set OMNIVORE_BOOT_TEST=1 to run it (it builds a Debian root: minutes the first time)"
[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, systemd-nspawn)"
for p in debootstrap systemd-nspawn nsenter meson ninja; do
    command -v "$p" >/dev/null 2>&1 ||
        skip "no '$p' (apt-get install debootstrap systemd-container meson ninja-build)"
done

cache=${OMNIVORE_BOOT_CACHE:-/var/cache/omnivore-boot-root}
mirror=${OMNIVORE_BOOT_MIRROR:-$(grep -rhoE 'https?://[^ ]*/debian/?' /etc/apt/sources.list \
    /etc/apt/sources.list.d 2>/dev/null | head -1)}
mirror=${mirror:-http://deb.debian.org/debian}
# What the programs need to run, and what an operator's steps use.
packages=systemd,systemd-sysv,dbus,procps,libzmq5,libprotobuf-c1,libopenblas0-pthread,libinih1
packages=$packages,zlib1g,libsystemd0,dataset-fashion-mnist
base=$cache/base root=$cache/run
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*"; }

# ---- the base root, once ----
if [ "$(cat "$base/.omnivore-packages" 2>/dev/null)" != "$packages" ]; then
    say "debootstrap bookworm from $mirror into $base (once; then cached)"
    mkdir -p "$cache"
    rm -rf "$base" "$base.tmp"
    if ! debootstrap --variant=minbase --include="$packages" bookworm "$base.tmp" "$mirror" \
        >"$cache/debootstrap.log" 2>&1; then
        tail -5 "$cache/debootstrap.log"
        rm -rf "$base.tmp"
        skip "debootstrap from $mirror failed (no network to the archive?): $cache/debootstrap.log"
    fi
    echo "$packages" >"$base.tmp/.omnivore-packages"
    mv "$base.tmp" "$base"
fi

# ---- the project, installed as the README says (meson setup --prefix=/usr, meson install) ----
say "build with --prefix=/usr and install into a copy of the base root"
bb=$build/systemd-boot
[ -f "$bb/build.ninja" ] || meson setup "$bb" "$src" --prefix=/usr -Dtests=disabled >/dev/null
ninja -C "$bb" >/dev/null
rm -rf "$root"
cp -a "$base" "$root"
meson install -C "$bb" --destdir "$root" --quiet >/dev/null

# ---- boot ----
log=$cache/console.log
nspawn=""
inside() { nsenter -t "$leader" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
cleanup() {
    rc=$?
    if [ -n "$nspawn" ] && kill -0 "$nspawn" 2>/dev/null; then
        if [ "$rc" -ne 0 ]; then
            echo "--- the daemon's and the workers' journal, last lines"
            inside journalctl -q --no-pager -n 60 -u omnivored -u 'omnivore-worker@*' || true
        fi
        kill -TERM "$nspawn" 2>/dev/null || true # the container's systemd powers off
        i=0
        while kill -0 "$nspawn" 2>/dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i + 1)); done
        kill -KILL "$nspawn" 2>/dev/null || true
    fi
    [ "$rc" -ne 0 ] && [ -f "$log" ] && { echo "--- $log"; tail -20 "$log"; }
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

say "boot it: systemd-nspawn -b --private-network"
SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 systemd-nspawn -q -D "$root" -b --register=no --keep-unit \
    --private-network --machine=omnivore-boot >"$log" 2>&1 </dev/null &
nspawn=$!
# The container's init: the child of systemd-nspawn that runs systemd (nspawn forks helpers
# that come and go before it), then until it says it is up.
leader="" state="" i=0
while [ $i -lt 1200 ]; do
    kill -0 "$nspawn" 2>/dev/null || { cat "$log"; skip "systemd-nspawn cannot boot here"; }
    leader=$(ps -o pid=,comm= --ppid "$nspawn" | awk '$2 == "systemd" { print $1; exit }')
    if [ -n "$leader" ]; then
        state=$(nsenter -t "$leader" -a systemctl is-system-running 2>/dev/null || true)
        case $state in running | degraded) break ;; esac
    fi
    sleep 0.1
    i=$((i + 1))
done
[ -n "$leader" ] || skip "systemd-nspawn started no container"
case $state in
running | degraded) say "booted: $state" ;;
*) say "FAIL: the container did not finish booting in 120 s: '$state'" && exit 1 ;;
esac

fails=0
ok() { say "ok: $*"; }
bad() { say "FAIL: $*"; fails=$((fails + 1)); }
# Polls `omnivorectl status` until it has the line $1, for at most $2 seconds.
wait_status() {
    i=0
    while [ $i -lt "$2" ]; do
        inside omnivorectl status 2>/dev/null | grep -qx "$1" && return 0
        sleep 1
        i=$((i + 1))
    done
    return 1
}
prop() { inside systemctl show -P "$1" "$2"; }
# Waits until unit $1 has restarted more than $2 times and is active, for at most $3 seconds.
wait_restart() {
    i=0
    while [ $i -lt "$3" ]; do
        [ "$(prop NRestarts "$1")" -gt "$2" ] && [ "$(prop ActiveState "$1")" = active ] &&
            return 0
        sleep 1
        i=$((i + 1))
    done
    return 1
}
field() { inside omnivorectl status | sed -n "s/^$1://p" | head -1; }

# ---- the README's steps, as an operator on the head node ----
say "install: systemd-sysusers, CURVE keys, job.ini, worker.conf, enable the units"
inside systemd-sysusers
inside install -d -m 0755 /etc/omnivore/keys
inside omnivorectl keygen daemon /etc/omnivore/keys >/dev/null
inside chown omnivore: /etc/omnivore/keys/daemon.key_secret
inside omnivorectl keygen --roles trainer,evaluator worker /etc/omnivore/keys >/dev/null
inside install -d /etc/omnivore/workers.d
inside cp /etc/omnivore/keys/worker.key /etc/omnivore/workers.d/
inside cp /usr/share/omnivore/examples/fashion-mlp.ini /etc/omnivore/job.ini
# Five epochs instead of three: time for the SIGKILL and the reload while it trains.
inside sed -i 's/^epochs = 3$/epochs = 5/' /etc/omnivore/job.ini
# worker.conf ships OMNIVORE_SERVER commented out, with the one-machine value beside it.
inside sed -i 's|^#OMNIVORE_SERVER=tcp://127.0.0.1:5555$|OMNIVORE_SERVER=tcp://127.0.0.1:5555|' \
    /etc/omnivore/worker.conf
inside grep -qx 'OMNIVORE_SERVER=tcp://127.0.0.1:5555' /etc/omnivore/worker.conf ||
    bad "worker.conf has no one-machine OMNIVORE_SERVER line to uncomment"
inside install -d /etc/omnivore/jobs
inside cp /usr/share/omnivore/examples/fashion-cnn.ini /usr/share/omnivore/examples/fashion-cnn.model \
    /etc/omnivore/jobs/
inside sh -c 'echo OMNIVORE_ROLE=evaluator > /etc/omnivore/worker-eval.conf'
inside systemctl enable --now omnivored 2>/dev/null
if [ "$(prop Type omnivored)" = notify ] && [ "$(prop ActiveState omnivored)" = active ]; then
    ok "omnivored is active through sd_notify: $(prop StatusText omnivored)"
else
    bad "omnivored: Type=$(prop Type omnivored) ActiveState=$(prop ActiveState omnivored)"
fi
inside systemctl enable --now omnivore-worker@1 omnivore-worker@2 omnivore-worker@eval 2>/dev/null
wait_status state:running 120 && ok "two workers and an evaluator: the job runs" ||
    bad "the job does not run"
# The workers on the head node share memory with the daemon, under both units' sandboxes.
wait_status 'shm_workers:2' 30 && ok "both trainers use shared memory with the daemon" ||
    bad "shared memory under the units: $(inside omnivorectl workers | grep -E '^(worker|transport)' | tr '\n' ' ')"

# ---- SIGKILL: restarted, resumed from the checkpoint ----
wait_status 'epoch:[1-9].*' 120 || true
inside omnivorectl checkpoint >/dev/null && ok "checkpoint written at epoch $(field epoch)" ||
    bad "omnivorectl checkpoint"
n=$(prop NRestarts omnivored)
inside systemctl kill -s KILL omnivored
if wait_restart omnivored "$n" 60 && wait_status 'resumed_from:/var/lib/omnivore/.*' 30; then
    ok "SIGKILL: restarted, resumed from $(field resumed_from) at epoch $(field resumed_epoch)"
else
    bad "SIGKILL: not restarted and resumed (NRestarts $(prop NRestarts omnivored))"
fi

# ---- reload: applied when systemctl reload returns ----
inside sed -i 's/^log_level = .*/log_level = debug/' /etc/omnivore/omnivored.conf
inside systemctl reload omnivored
[ "$(field log_level)" = debug ] && ok "reload: log_level is debug when systemctl reload returns" ||
    bad "reload: log_level is '$(field log_level)' after systemctl reload"
inside sed -i 's/^log_level = .*/log_level = loud/' /etc/omnivore/omnivored.conf
if inside systemctl reload omnivored 2>/dev/null; then
    bad "reload of a broken omnivored.conf succeeded"
else
    ok "reload of a broken omnivored.conf fails: $(inside journalctl -q -u omnivored -p err \
        --no-pager -o cat | grep 'reload:' | tail -1)"
fi
inside sed -i 's/^log_level = .*/log_level = info/' /etc/omnivore/omnivored.conf
inside systemctl reload omnivored

# ---- a checkpoint folder outside the state folder ----
inside install -d -o omnivore -g omnivore /srv/ckpt
out=$(inside omnivorectl submit /etc/omnivore/job.ini --set checkpoint.dir=/srv/ckpt 2>&1) &&
    bad "submit with checkpoint.dir=/srv/ckpt was accepted: $out" ||
    { echo "$out" | grep -q 'ReadWritePaths=/srv/ckpt' && ok "submit refused: $out" ||
        bad "submit refused, but the reason does not name ReadWritePaths=: $out"; }
# ---- a job under /home, which ProtectHome= hides from the daemon ----
inside install -d /home/operator
inside cp /etc/omnivore/job.ini /home/operator/job.ini
out=$(inside omnivorectl submit /home/operator/job.ini 2>&1) &&
    bad "a job under /home was accepted: $out" ||
    { echo "$out" | grep -q 'ProtectHome=yes' && ok "a job under /home is refused: $out" ||
        bad "a job under /home is refused without naming ProtectHome: $out"; }
inside mkdir -p /etc/systemd/system/omnivored.service.d
inside sh -c 'printf "[Service]\nReadWritePaths=/srv/ckpt\n" \
    > /etc/systemd/system/omnivored.service.d/checkpoints.conf'
inside sed -i 's|^checkpoint_root =.*|checkpoint_root = /srv/ckpt|' /etc/omnivore/omnivored.conf
inside systemctl daemon-reload

# ---- trained to done ----
if wait_status state:done 600; then
    ok "done: test_accuracy $(field test_accuracy), $(field epoch) epochs"
else
    bad "the job is not done: state $(field state)"
fi
sleep 1 # the STATUS= line is sent at most once a second
st=$(prop StatusText omnivored)
echo "$st" | grep -q ' 0/' && bad "STATUS= when done: $st" || ok "STATUS= when done: $st"

# ---- SIGSTOP: the watchdog restarts it (and the drop-in applies) ----
n=$(prop NRestarts omnivored)
s0=$(date +%s)
inside systemctl kill -s STOP omnivored
if wait_restart omnivored "$n" 120; then
    ok "SIGSTOP: restarted after $(($(date +%s) - s0)) s: $(inside journalctl -q -u omnivored \
        --no-pager -o cat | grep 'Watchdog timeout' | tail -1)"
else
    bad "SIGSTOP: no watchdog restart"
fi
wait_status state:done 30 && ok "after the restart the finished job is reported done" ||
    bad "after the restart: state $(field state)"
out=$(inside omnivorectl submit /etc/omnivore/jobs/fashion-cnn.ini --set checkpoint.dir=/srv/ckpt \
    2>&1) && ok "with ReadWritePaths=/srv/ckpt in a drop-in and checkpoint_root = /srv/ckpt, the" \
    "CNN example is accepted: $(echo "$out" | grep '^state:')" ||
    bad "submit with the drop-in: $out"
wait_status 'step:[1-9].*' 120 && ok "and it trains" || bad "the CNN job: state $(field state)"

# ---- a worker whose server name does not resolve: exit 2, not restarted ----
# The container has no DNS server (--private-network): names come from /etc/hosts alone, as on a
# cluster without DNS, so that "head" is unknown rather than unanswered.
inside sed -i 's/^hosts:.*/hosts: files/' /etc/nsswitch.conf
inside sh -c 'echo OMNIVORE_SERVER=tcp://head:5555 > /etc/omnivore/worker-bad.conf'
inside systemctl start omnivore-worker@bad 2>/dev/null || true
# Failed is where a unit that is not restarted ends; one to be restarted waits in auto-restart.
i=0
while [ "$(prop ActiveState omnivore-worker@bad)" != failed ] && [ $i -lt 40 ]; do
    sleep 1
    i=$((i + 1))
done
if [ "$(prop ExecMainStatus omnivore-worker@bad)" = 2 ] &&
    [ "$(prop NRestarts omnivore-worker@bad)" = 0 ]; then
    ok "worker with tcp://head:5555: $(inside journalctl -q -u omnivore-worker@bad -p err \
        --no-pager -o cat | grep 'cannot resolve' | tail -1)"
else
    bad "worker with tcp://head:5555: status $(prop ExecMainStatus omnivore-worker@bad), \
restarts $(prop NRestarts omnivore-worker@bad)"
fi

# ---- a mistake in omnivored.conf: exit 2, not restarted, and journalctl -p err says why ----
inside sh -c 'echo "log_levle = debug" >> /etc/omnivore/omnivored.conf'
inside systemctl restart omnivored 2>/dev/null || true
i=0
while [ "$(prop ActiveState omnivored)" != failed ] && [ $i -lt 40 ]; do
    sleep 1
    i=$((i + 1))
done
line=$(inside journalctl -q -u omnivored -p err --no-pager -o cat | grep '^omnivored: ' | tail -1)
if [ "$(prop ExecMainStatus omnivored)" = 2 ] && [ -n "$line" ]; then
    ok "a broken omnivored.conf: exit 2, and journalctl -p err: $line"
else
    bad "a broken omnivored.conf: status $(prop ExecMainStatus omnivored), err line '$line'"
fi

say "$fails failed"
[ "$fails" -eq 0 ]
