# lib.sh — the preamble the shell tests share (sourced, not a test itself):
# strict variables, the paths CTest passes in (FR_BIN, FR_SOURCE_DIR,
# FR_DATA_DIR), a scratch directory removed on exit, and the counting helpers
# ok/no with finish, which prints the closing "N passed, M failed" line and
# returns non-zero on any failure.
set -u
bin=${FR_BIN:?}
src=${FR_SOURCE_DIR:?}
data=${FR_DATA_DIR:-/usr/share/datasets/fashion-mnist}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
no() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
