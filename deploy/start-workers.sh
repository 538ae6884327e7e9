#!/bin/sh
# Starts omnivore workers on worker machines over ssh: N instances of omnivore-worker@.service on
# each host (omnivore-worker@1 .. @N), enabled so they come back after a reboot. Each host needs
# omnivore installed and /etc/omnivore/worker.conf pointing at the head node.
# Usage: start-workers.sh [-n N] [--sudo] [--restart|--stop] [--dry-run] HOST...
set -eu

usage() {
    cat <<'USAGE'
Usage: start-workers.sh [options] HOST...
Starts N omnivore workers (omnivore-worker@1 .. @N) on every HOST over ssh.

  -n, --instances N  workers per host (default 1)
      --sudo         run systemctl through sudo on the hosts (when you do not log in as root)
      --restart      restart the instances instead (workers stay stopped after a job is done:
                     this starts them for the next one)
      --stop         stop and disable the instances
      --dry-run      print the commands, run nothing
  -h, --help         this text

Environment: SSH (default "ssh") is the command used to reach a host, e.g.
SSH="ssh -o BatchMode=yes -l admin".
USAGE
}

n=1 sudo="" action="enable --now" dry=0
while [ $# -gt 0 ]; do
    case $1 in
    -n | --instances)
        [ $# -ge 2 ] || { echo "start-workers: $1 needs a number" >&2; exit 2; }
        n=$2
        shift 2
        ;;
    --instances=*) n=${1#*=}; shift ;;
    --sudo) sudo="sudo "; shift ;;
    --restart) action="restart"; shift ;;
    --stop) action="disable --now"; shift ;;
    --dry-run) dry=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "start-workers: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) break ;;
    esac
done
case $n in
'' | *[!0-9]*) echo "start-workers: --instances: '$n' is not a number" >&2; exit 2 ;;
esac
if [ "$n" -lt 1 ] || [ "$n" -gt 1024 ]; then
    echo "start-workers: --instances: $n is not from 1 to 1024" >&2
    exit 2
fi
[ $# -ge 1 ] || { echo "start-workers: give at least one HOST" >&2; usage >&2; exit 2; }

instances=""
i=1
while [ "$i" -le "$n" ]; do
    instances="$instances omnivore-worker@$i"
    i=$((i + 1))
done
ssh_cmd=${SSH:-ssh}
rc=0
for host in "$@"; do
    cmd="${sudo}systemctl $action$instances"
    if [ "$dry" -eq 1 ]; then
        echo "$ssh_cmd $host '$cmd'"
        continue
    fi
    echo "start-workers: $host: $cmd" >&2
    # shellcheck disable=SC2086
    if ! $ssh_cmd "$host" "$cmd" </dev/null; then
        echo "start-workers: $host: failed (see above); the other hosts go on" >&2
        rc=1
    fi
done
exit $rc
