#!/usr/bin/env bash
# test_opencl_notice.sh — the first OpenCL run tells the user that the
# driver is compiling kernels: with an empty PoCL kernel cache, `frugal
# train --device opencl` says "compiling OpenCL kernels" and names each
# program it built; a second run on the filled cache says nothing of it, and
# neither does a first run with --no-progress (the library prints only when
# asked). Skipped (77) without an OpenCL device, or when the device is not
# PoCL's (POCL_CACHE_DIR is PoCL's cache; another driver keeps its own).
. "$(dirname "$0")/lib.sh"

if ! "$bin" devices --json >"$tmp/devices" 2>&1; then
    echo "skipped: no OpenCL device (or built without OpenCL)"
    exit 77
fi
platform=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["devices"][0]["platform"])' "$tmp/devices")
case $platform in
*"Portable Computing Language"*) ;;
*)
    echo "skipped: device 0 is not PoCL's ($platform): its kernel cache is not POCL_CACHE_DIR"
    exit 77
    ;;
esac

# One step of a small MLP: a handful of programs, and every run starts cold
# in its own empty cache.
printf 'input 784\nlinear 64\nrelu\nlinear 10\n' >"$tmp/mlp.model"
run=(train --model "$tmp/mlp.model" --data "$data" --steps 1 --limit 64 --test-limit 64 --batch 64
    --threads 2 --device opencl)
notice="compiling OpenCL kernels for "
files() { find "$1" -type f | wc -l; }

mkdir "$tmp/cache1" "$tmp/cache2"
POCL_CACHE_DIR=$tmp/cache1 expect "first run" "$bin" "${run[@]}"
[ "$(files "$tmp/cache1")" -gt 0 ] && ok || no "the first run left nothing in POCL_CACHE_DIR: not a PoCL cache?"
grep -qF "$notice" "$tmp/err" && ok || no "first run: no '$notice': $(head -5 "$tmp/err")"
# each line names a program of src/backend/opencl/kernels, numbered from 1
grep -E '^  compiled [a-z_]+\.cl \(program [0-9]+, [0-9.]+ s so far\)$' "$tmp/err" >"$tmp/lines"
[ -s "$tmp/lines" ] && ok || no "first run: no '  compiled FILE.cl (program N, ...)' line: $(head -5 "$tmp/err")"
n=0
while read -r _ file rest; do
    n=$((n + 1))
    [ -f "$src/src/backend/opencl/kernels/$file" ] && ok || no "compiled $file: not an embedded program"
    case $rest in "(program $n,"*) ok ;; *) no "line $n counts: $rest" ;; esac
done <"$tmp/lines"

POCL_CACHE_DIR=$tmp/cache1 expect "second run" "$bin" "${run[@]}"
grep -qF "compiling OpenCL" "$tmp/err" && no "second run, cache filled: $(grep -F compil "$tmp/err" | head -3)" || ok

POCL_CACHE_DIR=$tmp/cache2 expect "first run, --no-progress" "$bin" "${run[@]}" --no-progress
[ "$(files "$tmp/cache2")" -gt 0 ] && ok || no "the --no-progress run compiled nothing"
grep -qF "compiling OpenCL" "$tmp/err" && no "--no-progress: $(grep -F compil "$tmp/err" | head -3)" || ok
finish
