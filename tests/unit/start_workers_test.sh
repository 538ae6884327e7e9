#!/bin/sh
# deploy/start-workers.sh: the commands it prints with --dry-run, the ones it runs through $SSH
# (a stand-in that records them), and its usage errors.
set -eu
script=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$script" --dry-run -n 2 w1 w2)
want="ssh w1 'systemctl enable --now omnivore-worker@1 omnivore-worker@2'
ssh w2 'systemctl enable --now omnivore-worker@1 omnivore-worker@2'"
[ "$out" = "$want" ] || fail "dry run printed: $out"

# A stand-in for ssh: records host and command; host 'bad' fails.
cat >"$tmp/ssh" <<'SSH'
#!/bin/sh
echo "$*" >>"$LOG"
[ "$1" != bad ]
SSH
chmod +x "$tmp/ssh"
LOG=$tmp/log SSH=$tmp/ssh "$script" --sudo --restart -n 1 h1 h2 2>/dev/null
[ "$(cat "$tmp/log")" = "h1 sudo systemctl restart omnivore-worker@1
h2 sudo systemctl restart omnivore-worker@1" ] || fail "ran: $(cat "$tmp/log")"

# One host failing does not stop the others, and the exit status says so.
: >"$tmp/log"
rc=0
LOG=$tmp/log SSH=$tmp/ssh "$script" --stop bad h3 2>/dev/null || rc=$?
[ "$rc" -eq 1 ] || fail "a failed host gave status $rc"
grep -q "^h3 systemctl disable --now omnivore-worker@1$" "$tmp/log" || fail "h3 skipped"

for args in "" "-n 0 h" "-n x h" "--bogus h"; do
    rc=0
    # shellcheck disable=SC2086
    "$script" $args >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || fail "'$args' gave status $rc, not 2"
done
echo "start-workers.sh: ok"
