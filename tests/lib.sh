# lib.sh — the preamble the shell tests share (sourced, not a test itself):
# strict variables, the paths CTest passes in (FR_BIN, FR_SOURCE_DIR,
# FR_DATA_DIR), a scratch directory removed on exit, and the counting helpers
# ok/no with finish, which prints the closing "N passed, M failed" line and
# returns non-zero on any failure; expect and expect_fail run a command and
# count its success, or its exit code and a text on stderr.
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
expect() { # description, command...; expects success
    local d=$1; shift
    if "$@" >"$tmp/out" 2>"$tmp/err"; then ok; else no "$d (exit $?): $(head -3 "$tmp/err")"; fi
}
expect_fail() { # description, exit code, text in stderr (fixed string), command...
    local d=$1 code=$2 pat=$3; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ "$rc" -eq "$code" ] && grep -qF -- "$pat" "$tmp/err"; then ok; else no "$d: exit $rc, stderr: $(head -3 "$tmp/err")"; fi
}
