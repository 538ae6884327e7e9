# Prints FILE:LINE NAME LENGTH for each function body (a '{' at column 0 to the next '}' at
# column 0) longer than max lines.
FNR == 1 { inbody = 0; sig = "" }
/^[A-Za-z_].*\(/ && !inbody { sig = $0; sigline = FNR }
/^\{/ && !inbody { inbody = 1; start = FNR; name = sig; next }
/^\}/ && inbody { inbody = 0; len = FNR - start - 1
    if (len > max) { n = name; sub(/\(.*/, "", n); sub(/.*[ *]/, "", n)
        printf "%s:%d %s %d\n", FILENAME, sigline, n, len } }
