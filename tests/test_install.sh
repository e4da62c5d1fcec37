#!/usr/bin/env bash
# test_install.sh — libfrugal as a C user gets it: the targets that
# scripts/run.sh builds are all that `cmake --install` needs; `cmake
# --install` of the build tree into a scratch prefix; libfrugal.so with its
# soname exporting exactly the functions include/frugal.h declares FR_API;
# every example compiled against the installed library with pkg-config
# (frugal.pc: the shared library, run without LD_LIBRARY_PATH; and
# frugal-static.pc from a moved copy of the prefix, the .so beside the .a,
# needing no libfrugal.so) and one run; a CMake project using
# find_package(frugal) with frugal::frugal and frugal::frugal_static; the
# installed `frugal --version`; and every source compiling for aarch64.
source "$(dirname "$0")/lib.sh"
build=${FR_BUILD_DIR:?}
prefix=$tmp/prefix
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
libdir=$(cache CMAKE_INSTALL_LIBDIR)
cc=$(cache CMAKE_C_COMPILER)
# A sanitized library needs the sanitizer runtime in whatever links it.
flags=()
[ "$(cache FR_SANITIZE)" = ON ] && flags=(-fsanitize=address,undefined)
run() { "$@" >"$tmp/out" 2>&1; }
version=$(sed -n 's/^#define FR_VERSION "\(.*\)"$/\1/p' "$src/include/frugal.h")

# The README installs from the build that scripts/run.sh makes, which builds
# only the targets its `--target` list names. CMake's file API, in a scratch
# tree configured with run.sh's own cmake line, lists every installed target
# and what each target depends on: all installed targets must be among
# run.sh's and their dependencies. (Building them again here would take
# minutes; what they produce is checked below, installed from $build.)
configure=$(sed -n 's/^\(cmake -S \. -B build .*\) >\/dev\/null$/\1/p' "$src/scripts/run.sh")
targets=$(sed -n 's/^cmake --build build .*--target \(.*\)$/\1/p' "$src/scripts/run.sh")
if [ -n "$configure" ] && [ -n "$targets" ]; then
    ok
    mkdir -p "$tmp/runsh/.cmake/api/v1/query"
    : >"$tmp/runsh/.cmake/api/v1/query/codemodel-v2"
    (cd "$src" && run ${configure/-B build/-B $tmp/runsh}) && ok || no "run.sh's cmake line: $(tail -5 "$tmp/out")"
    python3 - "$tmp/runsh/.cmake/api/v1/reply" $targets >"$tmp/missing" 2>&1 <<'PY'
import glob, json, os, sys
reply, wanted = sys.argv[1], sys.argv[2:]
index = json.load(open(max(glob.glob(os.path.join(reply, "index-*.json")))))
model = json.load(open(os.path.join(reply, index["reply"]["codemodel-v2"]["jsonFile"])))
targets = {}
for ref in model["configurations"][0]["targets"]:
    t = json.load(open(os.path.join(reply, ref["jsonFile"])))
    targets[t["name"]] = t
by_id = {t["id"]: name for name, t in targets.items()}
built, pending = set(), list(wanted)  # the targets run.sh builds, with what they need
while pending:
    name = pending.pop()
    if name in built: continue
    if name not in targets: print(f"run.sh builds {name}: no such target"); continue
    built.add(name)
    pending += [by_id[d["id"]] for d in targets[name].get("dependencies", [])]
installed = sorted(n for n, t in targets.items() if "install" in t)
if not installed: print("no installed target in the file API's reply")
for name in installed:
    if name not in built: print(f"installed target {name} is not built by run.sh's --target {' '.join(wanted)}")
PY
    [ $? -eq 0 ] && [ ! -s "$tmp/missing" ] && ok || no "$(cat "$tmp/missing")"
else
    no "scripts/run.sh: no 'cmake -S . -B build ... >/dev/null' line or no 'cmake --build build ... --target' line"
fi

run cmake --install "$build" --prefix "$prefix" && ok || no "cmake --install: $(tail -5 "$tmp/out")"
for f in "$libdir/libfrugal.a" "$libdir/libfrugal.so.$version" "$libdir/libfrugal.so.0" "$libdir/libfrugal.so" \
    include/frugal.h bin/frugal "$libdir/pkgconfig/frugal.pc" "$libdir/pkgconfig/frugal-static.pc" \
    "$libdir/cmake/frugal/frugalConfig.cmake" \
    "$libdir/cmake/frugal/frugalConfigVersion.cmake" "$libdir/cmake/frugal/frugalTargets.cmake"; do
    [ -e "$prefix/$f" ] && ok || no "installed $f"
done
readelf -d "$prefix/$libdir/libfrugal.so" | grep -q 'SONAME.*\[libfrugal\.so\.0\]' && ok ||
    no "soname libfrugal.so.0: $(readelf -d "$prefix/$libdir/libfrugal.so" | grep SONAME)"

# Exported: the FR_API declarations of the installed header, no more, no less.
grep '^FR_API' "$prefix/include/frugal.h" | grep -o '\bfr_[a-z0-9_]*(' | tr -d '(' | sort -u >"$tmp/declared"
nm -D --defined-only "$prefix/$libdir/libfrugal.so" | awk '{print $3}' | sort -u >"$tmp/exported"
[ "$(wc -l <"$tmp/declared")" -ge 50 ] && ok || no "FR_API declarations in frugal.h: $(wc -l <"$tmp/declared")"
if diff "$tmp/declared" "$tmp/exported" >"$tmp/diff"; then ok; else
    no "libfrugal.so exports what frugal.h declares (< declared only, > exported only): $(grep '^[<>]' "$tmp/diff" | head -20 | tr '\n' ' ')"
fi

# pkg-config: every example, strict, against the shared library; one run,
# with no LD_LIBRARY_PATH: frugal.pc gives the program a run path to it.
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
[ "$(pkg-config --modversion frugal)" = "$version" ] && ok || no "pkg-config --modversion: $(pkg-config --modversion frugal 2>&1)"
for ex in "$src"/examples/*.c; do
    name=$(basename "$ex" .c)
    run "$cc" -std=c11 -Wall -Wextra -Werror -pedantic "${flags[@]}" "$ex" -o "$tmp/$name" \
        $(pkg-config --cflags --libs frugal) && ok || no "pkg-config build of $name: $(head -20 "$tmp/out")"
done
env -u LD_LIBRARY_PATH ldd "$tmp/train_mlp" | grep -q "libfrugal.so.0 => $prefix/$libdir/pkgconfig/../../$libdir/" && ok ||
    no "train_mlp finds the installed libfrugal.so.0 by its run path: $(env -u LD_LIBRARY_PATH ldd "$tmp/train_mlp" | grep frugal)"
run env -u LD_LIBRARY_PATH "$tmp/train_mlp" 20
[ $? -eq 0 ] && grep -q "predicted peak of a step" "$tmp/out" && ok || no "train_mlp (shared): $(tail -5 "$tmp/out")"

# Static: a moved copy of the prefix, libfrugal.so still beside libfrugal.a
# (as a user has it); frugal-static.pc finds its new place, names the
# archive and brings the dependencies. The program needs no libfrugal.so.
cp -r "$prefix" "$tmp/moved"
[ -e "$tmp/moved/$libdir/libfrugal.so" ] && ok || no "the moved prefix has no libfrugal.so"
for static in "" --static; do
    run "$cc" "${flags[@]}" "$src/examples/train_mlp.c" -o "$tmp/train_mlp_static" \
        $(PKG_CONFIG_PATH=$tmp/moved/$libdir/pkgconfig pkg-config $static --cflags --libs frugal-static) && ok ||
        no "pkg-config $static frugal-static build: $(head -20 "$tmp/out")"
    readelf -d "$tmp/train_mlp_static" >"$tmp/dyn" 2>&1
    grep -q 'NEEDED.*libfrugal' "$tmp/dyn" && no "pkg-config $static frugal-static: the program needs libfrugal.so" || ok
    run env -u LD_LIBRARY_PATH "$tmp/train_mlp_static" 20
    [ $? -eq 0 ] && grep -q "predicted peak of a step" "$tmp/out" && ok || no "train_mlp (static): $(tail -5 "$tmp/out")"
done

# CMake: find_package(frugal) and both imported targets.
mkdir -p "$tmp/proj"
cp "$src/examples/train_mlp.c" "$tmp/proj/main.c"
cat >"$tmp/proj/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(use_frugal C)
find_package(frugal 0.1 REQUIRED)
add_executable(x main.c)
target_link_libraries(x frugal::frugal)
add_executable(xs main.c)
target_link_libraries(xs frugal::frugal_static)
EOF
run cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_FLAGS="${flags[*]}" -DCMAKE_EXE_LINKER_FLAGS="${flags[*]}" && ok || no "find_package(frugal): $(tail -20 "$tmp/out")"
run cmake --build "$tmp/proj/build" && ok || no "CMake project build: $(tail -20 "$tmp/out")"
ldd "$tmp/proj/build/x" | grep -q "libfrugal.so.0 => $prefix/$libdir/" && ok || no "frugal::frugal is the installed .so"
for x in x xs; do
    run "$tmp/proj/build/$x" 20
    [ $? -eq 0 ] && grep -q "predicted peak of a step" "$tmp/out" && ok || no "CMake-built $x: $(tail -5 "$tmp/out")"
done

# Portable: every source compiles for a non-x86 target (clang's aarch64, a
# syntax check with this machine's x86-64 headers). Two things in those
# headers do not apply to aarch64, and this test supplies them:
#  - On a non-x86-64 target, glibc's gnu/stubs.h includes gnu/stubs-32.h
#    (which names the functions glibc lacks on that target). An empty file
#    is enough for a syntax check.
#  - pthread.h's __regparm__ attribute is x86-only, so it is defined away.
# No x86 intrinsic outside its guard, no x86 target attribute where the
# compiler has no such target.
if command -v clang >/dev/null; then
    mkdir -p "$tmp/sys/gnu"
    : >"$tmp/sys/gnu/stubs-32.h"
    cblas=$(sed -n 's/^CBLAS_INCLUDE:[A-Z]*=//p' "$build/CMakeCache.txt")
    for f in $(cd "$src" && find src tools -name '*.c' | sort); do
        clang --target=aarch64-linux-gnu -std=c11 -D_GNU_SOURCE '-D__regparm__(n)=' -fopenmp -fsyntax-only \
            -Wall -Wextra -Werror -I"$src/include" -I"$src/src" -isystem "$tmp/sys" -isystem "$cblas" \
            -isystem /usr/include -isystem "/usr/include/$(gcc -print-multiarch)" "$src/$f" >"$tmp/out" 2>&1 &&
            ok || no "$f does not compile for aarch64: $(grep -m3 error "$tmp/out")"
    done
else
    echo "SKIP: no clang for the aarch64 compile check"
fi

[ "$("$prefix/bin/frugal" --version)" = "frugal $version" ] && ok || no "installed frugal --version: $("$prefix/bin/frugal" --version 2>&1)"
finish
