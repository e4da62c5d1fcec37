#!/usr/bin/env bash
# test_mpi_estimate.sh — `frugal estimate --ranks N [--zero K]` on one
# process: one rank's bytes by category at ZeRO stages 0-3 against the
# formulas worked out by hand for a small MLP with Adam (P = G = parameter
# bytes, O = 2P; shards by elements: the E = P/4 trainable floats, ceil(E/N)
# a rank, so x/N is x/E * ceil(E/N); stage 2 and 3 hold one bucket,
# min(25 MiB, G), and no gradient shard (the rank steps each bucket's
# share inside backward as its sums arrive; with --keep-grads, G/N);
# stage 3 gathers the two largest consecutive units, here
# fc1 and fc2: the gather walk of parallel/pshard.h holds fc1's block while
# fc2's is prefetched, and fc2's with fc3's, the larger pair being fc1 and
# fc2); the rank's batch is ceil(B/N); `train --zero 4` is refused and
# `--zero 3` without mpirun says that one process holds everything. Needs
# no MPI.
source "$(dirname "$0")/lib.sh"
cp "$(dirname "$0")/data/mlp3.model" "$tmp/m.model" # 784-64-32-10, no BatchNorm
fc1=$(((784 * 64 + 64) * 4)) fc2=$(((64 * 32 + 32) * 4)) fc3=$(((32 * 10 + 10) * 4))
P=$((fc1 + fc2 + fc3))
N=4
E=$((P / 4))
sh() { echo $(($1 / E * ((E + N - 1) / N))); }
want=("0 $P $P $((2 * P)) 0"
    "1 $P $P $(sh $((2 * P))) 0"
    "2 $P 0 $(sh $((2 * P))) $P"
    "3 $(($(sh $P) + fc1 + fc2)) 0 $(sh $((2 * P))) $P")
if "$bin" estimate --model "$tmp/m.model" --batch 62 --ranks $N --optimizer adam --json \
    >"$tmp/out" 2>"$tmp/err"; then ok; else no "estimate --ranks: $(head -2 "$tmp/err")"; fi
cat "$tmp/out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
print(d["ranks"], d["rank_batch"])
for s in d["stages"]:
    print(s["zero"], s["parameters"], s["gradients"], s["optimizer"], s["buckets"])
    assert s["total"] == s["parameters"] + s["gradients"] + s["optimizer"] + s["buckets"] + s["rest"]
' >"$tmp/got" 2>"$tmp/err" || no "the ranks JSON: $(tail -2 "$tmp/err")"
[ "$(head -1 "$tmp/got")" = "$N 16" ] && ok || no "ranks and rank batch: $(head -1 "$tmp/got")"
for k in 0 1 2 3; do
    got=$(sed -n "$((k + 2))p" "$tmp/got")
    [ "$got" = "${want[$k]}" ] && ok || no "stage $k: got '$got', formula '${want[$k]}'"
done
# --keep-grads: the rank keeps its gradient shard, G/N, at stages 2 and 3
"$bin" estimate --model "$tmp/m.model" --batch 62 --ranks $N --optimizer adam --keep-grads \
    --json >"$tmp/out" 2>"$tmp/err" || no "estimate --keep-grads: $(head -2 "$tmp/err")"
kg=$(cat "$tmp/out" | python3 -c 'import json, sys
print(*[s["gradients"] for s in json.loads(sys.stdin.read())["stages"]])')
[ "$kg" = "$P $P $(sh $P) $(sh $P)" ] && ok || no "--keep-grads gradients: '$kg'"
# one stage alone, as a table
"$bin" estimate --model "$tmp/m.model" --batch 64 --ranks 2 --zero 2 >"$tmp/out" 2>&1
sed -n '/^per rank on 2 ranks/,$p' "$tmp/out" >"$tmp/ranks"
[ "$(grep -c '^[0-3] ' "$tmp/ranks")" = 1 ] && grep -q '^2 ' "$tmp/ranks" && ok ||
    no "--zero 2: $(tail -3 "$tmp/out")"
expect_fail "train --zero 4" 2 "from 0 to 3" "$bin" train --model "$tmp/m.model" --zero 4
if [ -d "$data" ]; then # (the dataset, which the scripts install)
    "$bin" train --model "$tmp/m.model" --data "$data" --zero 3 --limit 128 --test-limit 64 \
        --epochs 1 >"$tmp/out" 2>"$tmp/err" || no "--zero 3 on one process: $(head -2 "$tmp/err")"
    grep -q "one process holds everything" "$tmp/err" && ok || no "--zero 3 alone: no word of it"
fi
finish
