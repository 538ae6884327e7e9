# Shared by bench/servers_links.sh and bench/wire_links.sh (sourced): the interleaved rounds at
# one link rate, and their medians as table rows and JSON.

links_median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# links_rate RATE KEY_PREFIX FORMAT: RUNS interleaved rounds of `one_run CASE` ("images/s
# accuracy") for each case of $cases, and of ddp_run (images/s) where $have_ddp is 1; then each
# case's medians as a row (printf FORMAT with the rate, the case, images/s and accuracy), added
# to $json as "RATE_KEY_PREFIXCASE". Uses $tmp; the links are shaped already.
links_rate() {
    : >"$tmp/ddp"
    for lc in $cases; do : >"$tmp/case-$lc"; done
    for _ in $(seq "$RUNS"); do
        for lc in $cases; do one_run "$lc" >>"$tmp/case-$lc"; done
        [ "$have_ddp" = 0 ] || ddp_run >>"$tmp/ddp"
    done
    for lc in $cases; do
        ips=$(cut -d' ' -f1 "$tmp/case-$lc" | links_median)
        acc=$(cut -d' ' -f2 "$tmp/case-$lc" | links_median)
        # shellcheck disable=SC2059 # the format is the caller's
        printf "$3" "$1" "$lc" "$ips" "$acc"
        json="$json\"${1}_$2$lc\":{\"images_per_second\":$ips,\"test_accuracy\":$acc},"
    done
    if [ -s "$tmp/ddp" ]; then
        ips=$(links_median <"$tmp/ddp")
        # shellcheck disable=SC2059
        printf "$3" "$1" ddp "$ips" -
        json="$json\"${1}_ddp\":{\"images_per_second\":$ips},"
    fi
}
