#!/usr/bin/env bash
# Prints the performance table of the guide (src/guide/performance.md) from the benches' own
# output: each figure beside this project's goal for it, and whether it is met.
#
#   bash scripts/perf-table.sh            runs the fast rows' benches, saving their output in
#                                         target/perf/, then prints the table
#   bash scripts/perf-table.sh --saved    prints the table from the output saved last time
#
# What it runs (release builds; a few minutes on two cores once built):
#   call    TOOLKEY_BENCH_RATIOS=1 cargo bench -p toolkey-tests --features sqlite,postgres,redis
#             --bench call -- 'toolbox read_only$|2 workers\)$'
#           criterion's `read_only` and 2-worker rows, and the `call/ratios` lines (the keyed rows
#           and their floors against the `read_only` call, timed side by side in rounds)
#   scale   TOOLKEY_SCALE_STORES=memory TOOLKEY_BENCH_RATIOS=1 cargo bench ... --bench scale
#             -- scale/memory
#           the memory store's bytes per record at a million records, and a reserve there
#           against one with a thousand records held
#   stores  TOOLKEY_BENCH_RATIOS=1 cargo bench ... --bench stores -- sqlite/re
#           a keyed first call and replay on SQLite, through Toolbox::call and at the store,
#           against raw rusqlite (needs the PostgreSQL and Redis servers of the tests: the bench
#           connects to each)
# The other benches (throughput, the compile-time harness, the server stores' rows) take longer
# and are run by hand; see CONTRIBUTING.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/target/perf"
features=sqlite,postgres,redis

if [ "${1:-}" != "--saved" ]; then
  mkdir -p "$out"
  cd "$root"
  bench() { cargo bench --quiet -p toolkey-tests --features "$features" --bench "$@"; }
  echo "perf: running the call bench" >&2
  TOOLKEY_BENCH_RATIOS=1 bench call -- 'toolbox read_only$|2 workers\)$' > "$out/call.txt"
  echo "perf: running the scale bench (memory store)" >&2
  TOOLKEY_SCALE_STORES=memory TOOLKEY_BENCH_RATIOS=1 bench scale -- scale/memory > "$out/scale.txt"
  echo "perf: running the stores bench (SQLite)" >&2
  TOOLKEY_BENCH_RATIOS=1 bench stores -- sqlite/re > "$out/stores.txt"
fi

[ -s "$out/call.txt" ] || { echo "perf: no saved output in $out/call.txt; run without --saved" >&2; exit 1; }
have() { [ -s "$out/$1.txt" ] || { echo "perf: no saved output in $out/$1.txt: its rows are left out" >&2; return 1; }; }

# criterion's median of a row: the middle figure of the `time: [low median high]` line that
# follows the row's name (on its line, or the next one when the name is long).
median() {
  awk -v row="$2" '
    index($0, row) == 1 { found = 1 }
    found && /time:/ { sub(/.*\[/, ""); print $3, $4; exit }
  ' "$out/$1.txt"
}
# A side-by-side line: "<what>: 21 rounds of N runs of each in turn: A against B per run
# (medians), R.RRx (...)"; prints "R.RR|A|B".
ratio() {
  grep -F "$2" "$out/$1.txt" | head -1 |
    sed -E 's/.*in turn: (.*) against (.*) per run \(medians\), ([0-9.]+)x.*/\3|\1|\2/'
}
# "a is at most b" for two numbers.
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
met() { if at_most "$1" "$2"; then echo yes; else echo no; fi; }
# A time in criterion's units as nanoseconds.
ns() {
  awk -v v="$1" -v u="$2" 'BEGIN {
    f = (u == "ns") ? 1 : (u == "µs" || u == "us") ? 1000 : (u == "ms") ? 1e6 : (u == "ps") ? 0.001 : 1e9
    printf "%.0f", v * f }'
}

row() { printf '| %s | %s | %s | %s | %s |\n' "$@"; }

echo "| what | measured | goal | figure | met |"
echo "|---|---|---|---|---|"

read -r v u <<<"$(median call 'call/toolbox read_only')"
row "a \`read_only\` tool's call" "through \`Toolbox::call\`" "≤ 1.5 µs" "$v $u" "$(met "$(ns "$v" "$u")" 1500)"

IFS='|' read -r r a b <<<"$(ratio call 'call/ratios: the read_only call against its floor')"
row "a \`read_only\` call, against its floor: its arguments read into the tool's type, its body, its result written as JSON, by hand" "through \`Toolbox::call\`, side by side" "≤ 2×" "${r}× ($a against $b)" "$(met "$r" 2)"

IFS='|' read -r r a b <<<"$(ratio call 'call/ratios: keyed first call (memory) against the read_only')"
row "a keyed first call, memory store, against the \`read_only\` call" "through \`Toolbox::call\`, side by side" "≤ 1.5×" "${r}× ($a against $b)" "$(met "$r" 1.5)"
IFS='|' read -r r a b <<<"$(ratio call "call/ratios: the keyed first call's floor")"
row "its floor: the \`read_only\` call, then this store's key, fingerprint, reserve and record by hand" "below \`Toolbox::call\` (the store's own calls)" "none: what a first call cannot skip" "${r}× ($a against $b)" "—"
IFS='|' read -r r a b <<<"$(ratio call "call/ratios: a bare record's floor")"
row "a bare record's floor: the \`read_only\` call, then a key, a SHA-256, a hash map insert and the outcome's text, with no store" "below \`Toolbox::call\` (plain parts)" "none: what any keeping of an outcome costs" "${r}× ($a against $b)" "—"
IFS='|' read -r r a b <<<"$(ratio call "call/ratios: keyed first call (memory) against the bare record's floor")"
row "a keyed first call, memory store, against the bare record's floor" "through \`Toolbox::call\`, side by side" "≤ 1.3×" "${r}× ($a against $b)" "$(met "$r" 1.3)"

IFS='|' read -r r a b <<<"$(ratio call 'call/ratios: keyed replay (memory) against')"
row "a keyed replay, memory store, against the \`read_only\` call" "through \`Toolbox::call\`, side by side" "≤ 1.0×" "${r}× ($a against $b)" "$(met "$r" 1.0)"
IFS='|' read -r r a b <<<"$(ratio call 'call/ratios: keyed replay (memory, local cache) against')"
row "a keyed replay behind \`CachedStore\`, against the \`read_only\` call" "through \`Toolbox::call\`, side by side" "≤ 1.0×" "${r}× ($a against $b)" "$(met "$r" 1.0)"

read -r v u <<<"$(median call 'call/keyed first call (memory, 2 workers)')"
row "a keyed first call, memory store, 2-worker runtime, caller outside it" "through \`Toolbox::call\`" "≤ 15 µs" "$v $u" "$(met "$(ns "$v" "$u")" 15000)"

if have scale; then
  line=$(grep -F 'bytes asked of the allocator per record' "$out/scale.txt" | head -1)
  held=$(sed -E 's/.*: ([0-9]+) bytes asked.*/\1/' <<<"$line")
  rss=$(sed -E 's/.*, ([0-9]+) bytes of resident.*/\1/' <<<"$line")
  size=$(sed -E 's/.* of a ([0-9]+)-byte result.*/\1/' <<<"$line")
  row "memory store: bytes per record at a million records (a ${size}-byte result)" "below \`Toolbox::call\` (the store's reserve and complete)" "≤ 300 B + the result" "$held B asked of the allocator, $rss B resident" "$(met "$held" $((300 + size)))"
  IFS='|' read -r r a b <<<"$(ratio scale 'memory store, a reserve with')"
  row "memory store: a reserve with a million records held, against a thousand" "below \`Toolbox::call\` (the store's reserve), side by side" "≤ 1.3×" "${r}× ($a against $b)" "$(met "$r" 1.3)"
fi
if have stores; then
  IFS='|' read -r r a b <<<"$(ratio stores 'sqlite first call through Toolbox::call')"
  row "SQLite: a keyed first call, against raw rusqlite's reserve and complete (WAL, \`synchronous = FULL\`)" "through \`Toolbox::call\`, side by side" "≤ 1.1×" "${r}× ($a against $b)" "$(met "$r" 1.1)"
  IFS='|' read -r r a b <<<"$(ratio stores 'sqlite reserve+complete, the store against raw rusqlite')"
  row "its store's share: the store's reserve and complete, against raw rusqlite's" "below \`Toolbox::call\` (the store), side by side" "none: part of the row above" "${r}× ($a against $b)" "—"
  IFS='|' read -r r a b <<<"$(ratio stores 'sqlite replay through Toolbox::call')"
  row "SQLite: a keyed replay, against a raw indexed \`SELECT\` of the outcome" "through \`Toolbox::call\`, side by side" "≤ 2×" "${r}× ($a against $b)" "$(met "$r" 2)"
  IFS='|' read -r r a b <<<"$(ratio stores 'sqlite replay, the store against the raw SELECT')"
  row "its store's share: the store's reserve meeting the completed record, against the raw \`SELECT\`" "below \`Toolbox::call\` (the store), side by side" "none: part of the row above" "${r}× ($a against $b)" "—"
fi
# The history bench fills each store with a million expired records, minutes of work: the script
# does not run it, but prints its rows when its output was saved by hand as
# target/perf/history.txt (`TOOLKEY_BENCH_RATIOS=1 cargo bench ... --bench history`).
if [ -s "$out/history.txt" ]; then
  for store in memory sqlite postgres redis; do
    if grep -qF "history/$store: a replay through Toolbox::call" "$out/history.txt"; then
      case $store in
        memory) name="memory store" ;; sqlite) name=SQLite ;; postgres) name=PostgreSQL ;; redis) name=Redis ;;
      esac
      if [ "$store" != memory ]; then
        IFS='|' read -r r a b <<<"$(ratio history "history/$store: a replay through Toolbox::call, 1000000 expired records held, against a raw")"
        row "$name: a replay with a million expired records held, against a raw primary-key read of its outcome" "through \`Toolbox::call\`, side by side" "≤ 1.5×" "${r}× ($a against $b)" "$(met "$r" 1.5)"
      fi
      IFS='|' read -r r a b <<<"$(ratio history "history/$store: a first call through Toolbox::call, 1000000 expired records")"
      row "$name: a first call with a million expired records held, against one on an empty store" "through \`Toolbox::call\`, side by side" "≤ 1.1×" "${r}× ($a against $b)" "$(met "$r" 1.1)"
    fi
  done
fi
