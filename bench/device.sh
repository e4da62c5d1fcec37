#!/usr/bin/env bash
# device.sh — frugal's step on an OpenCL device against the same step on the
# CPU, from `frugal profile --json` (synthetic batches, the steps after the
# first timed): for the CNN, the ResNet, gpt-tiny (short windows) and the
# 32-layer chain of the issue (input 1024, 32 x (linear 1024, relu),
# linear 10), Adam:
#   1. bytes per category at their peak: the CPU run's (host memory), the
#      device run's (device memory), the device run with --offload optimizer
#      (device, and the state the host then holds): the same plan gives the
#      same bytes, and offload moves the optimizer state off the device;
#   2. ms per step of each, and the cost of the offload;
#   3. the device's reserved peak with and without each offload
#      (--offload optimizer, --offload activations, both), against what each
#      moves (the optimizer state, the saved activations: the host block
#      of the activations run), and the step time each costs; the
#      activations' copies run on a copy queue beside the kernels, fetched a
#      layer ahead of their backward (on PoCL the copies take the same cores
#      as the kernels, so little of them can hide).
# On this project's CI host the device is PoCL, an OpenCL implementation on
# the CPU: its times are CPU times through another compiler and CLBlast's
# generic kernels, not a GPU's, and the README says so. Where `frugal
# devices` lists a GPU, DEVICE=opencl:N runs there.
#
#   bench/device.sh                        # writes bench/out/device.md and .json
#   MODELS="cnn chain" STEPS=3 bench/device.sh
#
# Each configuration runs REPEAT times, interleaved, and its fastest run is
# reported (the host is shared: the slower runs measure the neighbours).
# Environment: MODELS [cnn resnet gpt-tiny chain], STEPS [3], REPEAT [2], THREADS [2],
# DEVICE [opencl:0], BUILD [/tmp/build-device], OUT [bench/out].
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${BUILD:-/tmp/build-device}
out=${OUT:-$root/bench/out}
steps=${STEPS:-3}
threads=${THREADS:-2}
device=${DEVICE:-opencl:0}
mkdir -p "$out"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target frugal_cli >/dev/null 2>&1 || cmake --build "$build" -j2 >/dev/null
bin=$build/frugal
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$build/pocl-cache}
"$bin" devices >"$out/device_devices.txt" || {
    echo "device.sh: no OpenCL device (frugal devices)" >&2
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{ echo "input 1024"; for i in $(seq 32); do echo "linear 1024"; echo "relu"; done; echo "linear 10"; } >"$tmp/chain.model"

runs=$out/device_runs.jsonl
: >"$runs"
for rep in $(seq "${REPEAT:-2}"); do
for model in ${MODELS:-cnn resnet gpt-tiny chain}; do
    args=(--model "$model" --batch 64 --optimizer adam)
    case $model in
    chain) args=(--model "$tmp/chain.model" --batch 64 --optimizer adam) ;;
    resnet) args=(--model resnet --batch 32 --optimizer adam) ;;
    gpt-tiny) args=(--model gpt-tiny --batch 4 --seq 64 --optimizer adamw) ;;
    esac
    for cfg in cpu device devkg offload offact both; do
        # the CPU keeps every gradient too (--keep-grads): on a device the
        # optimizer runs after backward, so that is the same plan
        extra=(--keep-grads)
        [ "$cfg" != cpu ] && extra=(--device "$device")
        [ "$cfg" = devkg ] && extra+=(--keep-grads)
        [ "$cfg" = offload ] && extra+=(--offload optimizer)
        [ "$cfg" = offact ] && extra+=(--offload activations)
        [ "$cfg" = both ] && extra+=(--offload optimizer,activations)
        echo "device.sh: $model $cfg (run $rep)" >&2
        line=$("$bin" profile "${args[@]}" --steps "$steps" --threads "$threads" --json \
            --trace "$tmp/t.json" --svg "$tmp/t.svg" "${extra[@]}" 2>/dev/null | tail -1)
        printf '{"model": "%s", "config": "%s", "result": %s}\n' "$model" "$cfg" "$line" >>"$runs"
    done
done
done

python3 - "$runs" "$out" "$device" "$(head -3 "$out/device_devices.txt" | tail -1)" <<'EOF'
import json, sys, datetime
runs, out, device, devline = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [json.loads(l) for l in open(runs)]
by = {}
for r in rows:  # the fastest of the repeats (the bytes are the same in each)
    k = (r["model"], r["config"])
    if k not in by or r["result"]["ms_per_step"] < by[k]["ms_per_step"]:
        by[k] = r["result"]
models = []
for r in rows:
    if r["model"] not in models:
        models.append(r["model"])
cats = ["parameters", "gradients", "optimizer", "activations", "workspace", "data"]
mib = lambda b: "%.2f" % (b / 1048576)
lines = ["# frugal on an OpenCL device against the CPU", "",
         "%s UTC, `bench/device.sh`, device %s: `%s`. PoCL is an OpenCL implementation on "
         "the CPU: its times are CPU times through CLBlast's generic kernels, not a GPU's." %
         (datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), device, devline.strip()), ""]
summary = {}
for m in models:
    cpu, dev, off, oa = by[(m, "cpu")], by[(m, "device")], by[(m, "offload")], by[(m, "offact")]
    bo, kg = by[(m, "both")], by[(m, "devkg")]
    kd = kg["memory"]["device"]
    hc, dd, od, ad = cpu["memory"], dev["memory"]["device"], off["memory"]["device"], oa["memory"]["device"]
    bd = bo["memory"]["device"]
    lines += ["## %s" % m, "",
              "| category | CPU run (host) MiB | device run (device) MiB | device, --offload optimizer (device) MiB | offloaded: host MiB |",
              "|---|---:|---:|---:|---:|"]
    lines[-2] = lines[-2] + (" --offload activations (device) MiB | offloaded: host MiB |"
                             " both (device) MiB | offloaded: host MiB |")
    lines[-1] = lines[-1] + "---:|---:|---:|---:|"
    for c in cats:
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (c,
                     mib(hc["allocated_peak"][c]),
                     mib(dd["allocated_peak"][c]), mib(od["allocated_peak"][c]),
                     mib(off["memory"]["allocated_peak"][c]), mib(ad["allocated_peak"][c]),
                     mib(oa["memory"]["allocated_peak"][c]), mib(bd["allocated_peak"][c]),
                     mib(bo["memory"]["allocated_peak"][c])))
    lines.append("| (device run with --keep-grads: gradients %s MiB, reserved peak %s MiB, %.1f ms "
                 "per step) | | | | | | | | |" % (mib(kd["allocated_peak"]["gradients"]),
                 mib(kd["reserved_peak"]), kg["ms_per_step"]))
    lines.append("| reserved peak | %s | %s | %s | | %s | | %s | |" % (mib(hc["reserved_peak"]),
                 mib(dd["reserved_peak"]), mib(od["reserved_peak"]), mib(ad["reserved_peak"]),
                 mib(bd["reserved_peak"])))
    lines.append("| ms per step | %.1f | %.1f | %.1f | | %.1f | | %.1f | |" % (cpu["ms_per_step"],
                 dev["ms_per_step"], off["ms_per_step"], oa["ms_per_step"], bo["ms_per_step"]))
    # the same plan: the CPU keeps its gradients, so the device run with --keep-grads
    same = all(hc["allocated_peak"][c] == kd["allocated_peak"][c]
               for c in ["parameters", "gradients", "optimizer", "activations"])
    fell = dd["reserved_peak"] - od["reserved_peak"]
    lines += ["", "- parameters, gradients, optimizer state and activations: %s on the CPU and "
              "the device (both keeping their gradients)" %
              ("the same bytes" if same else "DIFFERENT bytes"),
              "- the device's default step runs the optimizer inside backward and keeps no "
              "gradient buffers; an offloaded optimizer needs them on the device (its copies "
              "start after backward), so against the default the optimizer offload saves the "
              "state less the gradients, against --keep-grads the state",
              "- --offload optimizer: the device's reserved peak falls by %s MiB (its optimizer "
              "state was %s MiB); step time %.2fx the device's without offload" %
              (mib(fell), mib(dd["allocated_peak"]["optimizer"]),
               off["ms_per_step"] / dev["ms_per_step"]),
              "- --offload activations: the device's reserved peak falls by %s MiB, activations "
              "at their peak %s -> %s MiB; step time %.2fx" %
              (mib(dd["reserved_peak"] - ad["reserved_peak"]), mib(dd["allocated_peak"]["activations"]),
               mib(ad["allocated_peak"]["activations"]), oa["ms_per_step"] / dev["ms_per_step"])]
    state, saved = dd["allocated_peak"]["optimizer"], oa["memory"]["allocated_peak"]["activations"]
    both_fell = kd["reserved_peak"] - bd["reserved_peak"]
    lines += ["- both (--offload optimizer,activations): the device's reserved peak falls by %s MiB "
              "from the same plan on the device (--keep-grads), %s the optimizer state and the "
              "saved activations together (%s + %s MiB, the latter the host block the "
              "activations run holds), and by %s MiB from the default step; step time %.1f -> "
              "%.1f ms (%.2fx the --keep-grads run's)" %
              (mib(both_fell), "at least" if both_fell >= state + saved else "LESS than",
               mib(state), mib(saved), mib(dd["reserved_peak"] - bd["reserved_peak"]),
               kg["ms_per_step"], bo["ms_per_step"], bo["ms_per_step"] / kg["ms_per_step"]), ""]
    summary[m] = {"same_bytes": same, "offload_fell": fell,
                  "optim_state": dd["allocated_peak"]["optimizer"],
                  "activations_fell": dd["reserved_peak"] - ad["reserved_peak"],
                  "saved_activations": saved, "both_fell": both_fell,
                  "ms": {k: by[(m, k)]["ms_per_step"]
                         for k in ("cpu", "device", "devkg", "offload", "offact", "both")}}
open(out + "/device.md", "w").write("\n".join(lines) + "\n")
json.dump(summary, open(out + "/device.json", "w"), indent=1)
print("\n".join(lines))
EOF
