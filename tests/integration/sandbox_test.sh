#!/bin/sh
# The units' sandbox, checked against what the programs really do: omnivored (tcp, control socket,
# checkpoints), a trainer with two BLAS threads and an evaluator train a small job under the
# units' RestrictAddressFamilies= and MemoryDenyWriteExecute= (sandbox_exec applies them as
# systemd does), and under strace: every system call they make must be in
# SystemCallFilter=@system-service and outside ~@privileged. (A call the filter refuses fails
# with EPERM, and a refused address family with EAFNOSUPPORT, which ZeroMQ takes for fatal.)
# Usage: sandbox_test.sh OMNIVORED OMNIVORE_WORKER OMNIVORECTL MAKE_BLOBS SANDBOX_EXEC \
#            OMNIVORED_UNIT WORKER_UNIT                                        (77 = skipped)
set -eu
daemon=$1 worker=$2 ctl=$3 make_blobs=$4 sandbox=$5 daemon_unit=$6 worker_unit=$7
. "$(dirname "$0")/../lib/cluster_lib.sh"
families() { sed -n 's/^RestrictAddressFamilies=//p' "$1"; }
fam_daemon=$(families "$daemon_unit") fam_worker=$(families "$worker_unit")
if [ -z "$fam_daemon" ] || [ -z "$fam_worker" ]; then
    echo "FAIL: a unit without RestrictAddressFamilies="
    exit 1
fi
grep -q '^MemoryDenyWriteExecute=yes$' "$daemon_unit" && mdwe_daemon=--mdwe || mdwe_daemon=
grep -q '^MemoryDenyWriteExecute=yes$' "$worker_unit" && mdwe_worker=--mdwe || mdwe_worker=
command -v strace >/dev/null 2>&1 || { echo "skipped: no strace (Debian package strace)"; exit 77; }
command -v systemd-analyze >/dev/null 2>&1 || { echo "skipped: no systemd-analyze"; exit 77; }
tmp=$(mktemp -d)
pids=""
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    rc=$?
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
# strace needs ptrace, which some containers refuse.
if ! strace -f -qq -o /dev/null true 2>/dev/null; then
    echo "skipped: strace cannot trace here"
    exit 77
fi
strace=$(command -v strace)
# run NAME FAMILIES MDWE PROGRAM ARGS...: PROGRAM sandboxed, traced into $tmp/NAME.trace.
run() {
    name=$1 fam=$2 mdwe=$3
    shift 3
    "$sandbox" --families "$fam" ${mdwe:+"$mdwe"} -- "$strace" -f -qq -o "$tmp/$name.trace" "$@" \
        2>"$tmp/$name.log" &
}

"$make_blobs" "$tmp"
blobs_job "$tmp/job.ini" sandbox 2
cat >>"$tmp/job.ini" <<JOB
[cluster]
workers = 1
[checkpoint]
every_steps = 50
JOB
sock=$tmp/control.sock
# A port of our own: the pid keeps concurrent runs apart.
port=$((20000 + $$ % 20000))
ep=tcp://127.0.0.1:$port
# CURVE, as on a real network.
curve_keys "$ctl" "$tmp/keys" "$tmp/omnivored.conf"
run daemon "$fam_daemon" "$mdwe_daemon" "$daemon" --once --job "$tmp/job.ini" --endpoint "$ep" \
    --control "$sock" --state-dir "$tmp" --log-level warn --config "$tmp/omnivored.conf"
d=$!
pids="$d"
n=0
until "$ctl" --socket "$sock" status >/dev/null 2>&1; do
    n=$((n + 1))
    [ $n -lt 300 ] || { echo "FAIL: omnivored did not answer"; exit 1; }
    kill -0 "$d" 2>/dev/null || { echo "FAIL: omnivored exited:"; cat "$tmp/daemon.log"; exit 1; }
    sleep 0.1
done
# shellcheck disable=SC2086
run trainer "$fam_worker" "$mdwe_worker" "$worker" --server "$ep" --threads 2 --log-level warn $tkey
w=$!
# shellcheck disable=SC2086
run evaluator "$fam_worker" "$mdwe_worker" "$worker" --server "$ep" --role evaluator \
    --log-level warn $ekey
e=$!
pids="$d $w $e"
wait "$w" || { echo "FAIL: the trainer exited with status $?"; cat "$tmp/trainer.log"; exit 1; }
wait "$e" || { echo "FAIL: the evaluator exited with status $?"; cat "$tmp/evaluator.log"; exit 1; }
"$ctl" --socket "$sock" status | grep -q '^state:done$' || { echo "FAIL: job not done"; exit 1; }
"$ctl" --socket "$sock" checkpoint >/dev/null
"$ctl" --socket "$sock" shutdown >/dev/null
wait "$d" || { echo "FAIL: omnivored exited with status $?"; cat "$tmp/daemon.log"; exit 1; }
pids=""

# The filter groups, expanded into system call names.
expand() {
    systemd-analyze syscall-filter "$1" | sed -n '2,$p' | sed -E 's/^ +//; s/ .*//' |
        grep -v -e '^#' -e '^$' | while read -r s; do
            case $s in
            @*) expand "$s" ;;
            *) echo "$s" ;;
            esac
        done
}
expand @system-service | sort -u >"$tmp/allowed"
expand @privileged | sort -u >"$tmp/privileged"
rc=0
for t in daemon trainer evaluator; do
    sed -E 's/^[0-9]+ +//; s/\(.*//' "$tmp/$t.trace" | grep -E '^[a-z_0-9]+$' |
        sort -u >"$tmp/$t.calls"
    out=$(comm -23 "$tmp/$t.calls" "$tmp/allowed" | tr '\n' ' ')
    priv=$(comm -12 "$tmp/$t.calls" "$tmp/privileged" | tr '\n' ' ')
    fams=$(grep -o 'socket(AF_[A-Z0-9]*' "$tmp/$t.trace" | sed 's/socket(//' | sort -u |
        tr '\n' ' ')
    allowed=$fam_worker
    [ $t = daemon ] && allowed=$fam_daemon
    echo "$t: $(wc -l <"$tmp/$t.calls") system calls; families used: $fams(allowed: $allowed)"
    [ -z "$out" ] || { echo "FAIL: $t calls outside @system-service: $out"; rc=1; }
    [ -z "$priv" ] || { echo "FAIL: $t calls @privileged: $priv"; rc=1; }
    for f in $fams; do
        case " $allowed " in
        *" $f "*) ;;
        *) echo "FAIL: $t opens a socket of family $f"; rc=1 ;;
        esac
    done
done
exit $rc
