#!/usr/bin/env bash
# test_format.sh — the C sources follow the checked-in .clang-format: every
# tracked .c/.h file (the generated reference tables aside) is formatted as
# clang-format would format it. scripts/test.sh installs clang-format.
source "$(dirname "$0")/lib.sh"
if ! command -v clang-format >/dev/null; then
    echo "clang-format is not installed (scripts/test.sh installs it): skipped"
    echo "0 passed, 0 failed"
    exit 0
fi
cd "$src" || exit 1
files=$(git ls-files '*.c' '*.h' 2>/dev/null | grep -v '_ref\.h$')
[ -n "$files" ] || files=$(find src include tools tests bench examples fuzz -name '*.[ch]' ! -name '*_ref.h')
for f in $files; do
    if clang-format --dry-run --Werror "$f" >"$tmp/out" 2>&1; then ok; else no "$f is not formatted: $(head -3 "$tmp/out")"; fi
done
finish
