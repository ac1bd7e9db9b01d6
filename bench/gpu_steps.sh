# Sourced by the GPU run scripts: timed steps under a deadline. The sourcing script sets OUT, DEADLINE_S, and
# T_HALF (the clock its deadline counts from), and defines say().
left() { echo $(( DEADLINE_S - ($(date +%s) - T_HALF) )); }

# step NAME MAX_S CMD...: runs CMD under a timeout (MAX_S, or what is left of the deadline), logs to $OUT/NAME.log,
# and appends "NAME<TAB>exit code<TAB>seconds" to $OUT/steps.tsv.
step() {
    local name=$1 max=$2; shift 2
    local budget; budget=$(left)
    if [ "$budget" -lt 30 ]; then
        say "$name: skipped, ${budget}s left"
        printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"
        return 99
    fi
    [ "$max" -gt "$budget" ] && max=$budget
    local t0; t0=$(date +%s)
    say "$name: start (limit ${max}s)"
    timeout -k 10 "$max" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local dt=$(( $(date +%s) - t0 ))
    printf '%s\t%s\t%s\n' "$name" "$rc" "$dt" >> "$OUT/steps.tsv"
    say "$name: exit $rc after ${dt}s"
    return $rc
}
