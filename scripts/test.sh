#!/usr/bin/env bash
# test.sh — install what is missing, then build and run the whole test suite
# twice: the optimized build, and under AddressSanitizer + UBSan; then run
# each libFuzzer target for a bounded time. Prints the CTest summaries and a
# final "N passed, M failed" line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh clang libclang-rt-14-dev clang-format
jobs=$(nproc)
export OMP_NUM_THREADS=2
passed=0
failed=0

run_suite() { # build-dir, ctest's extra arguments (one string), cmake args...
    local dir=$1 extra=$2
    shift 2
    cmake -S . -B "$dir" "$@" >/dev/null
    cmake --build "$dir" -j"$jobs"
    # shellcheck disable=SC2086 # $extra: split into its words
    if (cd "$dir" && ctest --output-on-failure -j"$jobs" $extra); then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
}

echo "== optimized build"
run_suite build "" -DCMAKE_BUILD_TYPE=Release -DFR_WERROR=ON
echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
# A test that fails here is run once more: LeakSanitizer's tracer, which
# stops every thread at exit to scan for leaks, now and then segfaults on
# its way out of a process with many threads (PoCL's workers) after the
# test itself passed ("Tracer caught signal 11 ... LeakSanitizer has
# encountered a fatal error": google/sanitizers#1353, a sanitizer runtime
# bug). A deterministic fault fails both runs, and the first failure stays in
# the log.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    FR_SANITIZED=1 run_suite build-asan "--repeat until-pass:2" -DCMAKE_BUILD_TYPE=Debug \
    -DFR_SANITIZE=ON -DFR_WERROR=ON

echo "== fuzzing the parsers (bounded)"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DFR_SANITIZE=ON -DFR_FUZZ=ON -DFR_WERROR=ON >/dev/null
fuzzers=$(cd fuzz && ls fuzz_*.c | sed 's/\.c$//')
for f in $fuzzers; do cmake --build build-fuzz -j"$jobs" --target "$f"; done
secs=${FR_FUZZ_SECONDS:-30}
for name in $fuzzers; do
    f=build-fuzz/$name
    corpus=fuzz/corpus/${name#fuzz_}
    work=$(mktemp -d)
    [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
    if "$f" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=0 "$work" >"$work.log" 2>&1; then
        echo "$name: no crash in ${secs}s ($(grep -c . "$work.log") log lines)"
        passed=$((passed + 1))
    else
        echo "$name: FAILED"; tail -40 "$work.log"
        failed=$((failed + 1))
    fi
    rm -rf "$work" "$work.log"
done

echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
