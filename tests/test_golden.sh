#!/usr/bin/env bash
# test_golden.sh — issue 22's proof that a refactor keeps results bit for
# bit: bench/golden.sh's fixed set of runs (the CNN with SGD momentum, Adam
# and AdamW int8, under a budget with revolve, bf16/fp16-mixed, gpt-tiny
# AdamW, OpenCL with and without offload, 2 and 3 ranks at ZeRO 0-3, greedy
# generate) must print exactly the losses and weight hashes recorded in
# tests/data/golden.txt. Floating-point bits depend on the CPU's kernels
# (OpenBLAS and oneDNN pick them by its model, features and caches), so the
# file is keyed by the host: model name, cpuid family and model (Zen 4 and
# Zen 5 EPYCs share a name and these features, not their bits), and the
# vector extensions that choose kernels. On a
# host with no record the test still checks that two runs of the first
# entry agree bit for bit, and says that the comparison was not made.
# The optimized build only: a sanitizer build runs other code (skipped, 77).
. "$(dirname "$0")/lib.sh"
# lscpu's labels and sort's order follow the locale; the records' keys are the C locale's
export LC_ALL=C
if [ -n "${LSAN_OPTIONS:-}${ASAN_OPTIONS:-}" ]; then
    echo "skipped: golden bits are those of the optimized build (this one runs under a sanitizer)"
    exit 77
fi
[ -d "$data" ] || { echo "skipped: no Fashion-MNIST at $data"; exit 77; }
key() {
    printf '%s (family %s model %s) |' "$(lscpu | sed -n 's/^Model name: *//p')" \
        "$(lscpu | sed -n 's/^CPU family: *//p')" "$(lscpu | sed -n 's/^Model: *//p')"
    grep -o -w 'avx2\|avx512f\|avx512_bf16\|avx512_fp16\|amx_tile\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '
}
host=$(key)
golden=$src/tests/data/golden.txt
bindir=$(dirname "$bin")
bash "$src/bench/golden.sh" "$bindir" >"$tmp/now.txt" 2>"$tmp/err"
grep -v '^#' "$tmp/now.txt" >"$tmp/now"
if grep -q FAILED "$tmp/now"; then no "a golden run failed: $(grep FAILED "$tmp/now")"; else ok; fi
if grep -qxF "# host: $host" "$golden"; then
    # the record of this host: the lines after its header up to the next header
    awk -v h="# host: $host" '$0 == h {on = 1; next} /^# host: / {on = 0} on && !/^#/' "$golden" >"$tmp/want"
    # runs skipped here (no OpenCL device, no mpirun) are said, not compared
    while read -r name rest; do
        got=$(grep "^$name " "$tmp/now")
        if [ -z "$got" ]; then
            echo "not run here: $name"
        elif [ "$got" = "$name $rest" ]; then
            ok
        else
            no "$name differs from the golden record:
  want: $name $rest
  got:  $got"
        fi
    done <"$tmp/want"
else
    echo "no golden record for this host ($host): checking that a second run of each CPU entry is identical instead"
    bash "$src/bench/golden.sh" "$bindir" | grep -v '^#' >"$tmp/again"
    if cmp -s "$tmp/now" "$tmp/again"; then ok; else no "two runs differ: $(diff "$tmp/now" "$tmp/again" | head -5)"; fi
fi
finish
