#!/usr/bin/env bash
# test_lora_cli.sh — LoRA from the command line: a small GPT's base trained
# and saved, then --init base --lora fine-tuned with --save-adapter (PEFT's
# pair: Python's json reads adapter_config.json, the safetensors names are
# PEFT's base_model.model.<layer>.lora_A.weight with (r, in) and (out, r)
# shapes) and --merge (an ordinary state_dict: the base's names, no adapter),
# the predicted step reservation against the measured peak;
# eval with --weights base --adapter gives the training run's validation loss
# bit for bit, the merged file within 1e-6; generate gives the same greedy
# text both ways; a run stopped and resumed with the same --lora ends with
# the uninterrupted run's validation loss bit for bit (adapter dropout on),
# a resume with other --lora is refused by name; every bad input the issue
# names is refused with exit 1, a message naming the option, the layer and
# the fault, and no file written.
source "$(dirname "$0")/lib.sh"

M="$src/tests/data/small_gpt.model" # 2 layers, context 32, d 32
python3 - "$tmp/text.txt" <<'PY'
import sys
s = "the quick brown fox jumps over the lazy dog. a frugal engine counts every byte.\n"
open(sys.argv[1], "w").write(s * 500)
PY
run() { "$bin" train --model "$M" --data "$tmp/text.txt" --batch 8 --threads 2 --lr 3e-3 --optimizer adamw --test-limit 16 --json "$@"; }
val() { python3 -c 'import json,sys
e=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(repr([x for x in e if x["event"]=="eval"][-1]["val_loss"]))' "$1"; }
evl() { python3 -c 'import json,sys
print(repr([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["loss"]))' "$1"; }
L=(--lora r=4,alpha=8,target=attn.c_attn,mlp.c_fc)

expect "train the base" run --steps 20 --save "$tmp/base.st" --save-weights-only
expect "lora fine-tune" run --steps 20 --init "$tmp/base.st" "${L[@]}" --save-adapter "$tmp/ad" --merge "$tmp/merged.st"
cp "$tmp/out" "$tmp/lora.json"

# PEFT's files, read by Python
python3 - "$tmp/ad" "$tmp/merged.st" "$tmp/base.st" >"$tmp/py" 2>&1 <<'PY' && ok || no "PEFT files: $(cat "$tmp/py")"
import json, struct, sys
def header(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))
cfg = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8, cfg
assert cfg["target_modules"] == ["attn.c_attn", "mlp.c_fc"] and cfg["bias"] == "none", cfg
h = header(sys.argv[1] + "/adapter_model.safetensors")
names = sorted(k for k in h if k != "__metadata__")
want = sorted("base_model.model.transformer.h.%d.%s.lora_%s.weight" % (b, l, w)
              for b in range(2) for l in ("attn.c_attn", "mlp.c_fc") for w in "AB")
assert names == want, names
shapes = {"attn.c_attn": 96, "mlp.c_fc": 128}
for k in names:
    out = shapes[k.split(".", 5)[5].rsplit(".lora_", 1)[0]]
    exp = [4, 32] if ".lora_A." in k else [out, 4]
    assert h[k]["shape"] == exp and h[k]["dtype"] == "F32", (k, h[k])
m, b = header(sys.argv[2]), header(sys.argv[3])
assert sorted(m) == sorted(b) and not any("lora" in k for k in m), sorted(set(m) ^ set(b))
PY

# the step's predicted reservation against the allocator's peak (the data
# term beyond the step is small here: test_gpt_cli's bound)
python3 - "$tmp/lora.json" >"$tmp/py" 2>&1 <<'PY' && ok || no "lora: predicted vs measured: $(cat "$tmp/py")"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
p, m = s["predicted_step_reserved"], s["measured_reserved_peak"]
assert p <= m <= p * 1.02 + (1 << 20), (p, m)
PY

expect "eval base + --adapter" "$bin" eval --model "$M" --data "$tmp/text.txt" --weights "$tmp/base.st" --adapter "$tmp/ad" --batch 8 --test-limit 16 --json
cp "$tmp/out" "$tmp/e1.json"
expect "eval merged" "$bin" eval --model "$M" --data "$tmp/text.txt" --weights "$tmp/merged.st" --batch 8 --test-limit 16 --json
cp "$tmp/out" "$tmp/e2.json"
a=$(val "$tmp/lora.json") b=$(evl "$tmp/e1.json") c=$(evl "$tmp/e2.json")
python3 -c "
a, b, c = $a, $b, $c
assert abs(a - b) <= 5e-9 * a, (a, b)  # eval prints 9 significant digits
assert abs(a - c) <= 1e-6 * a, (a, c)
print('validation loss: training', a, 'adapter', b, 'merged', c)" >"$tmp/py" 2>&1 && ok || no "eval losses: $(cat "$tmp/py")"
expect "generate with --adapter" "$bin" generate --model "$M" --weights "$tmp/base.st" --adapter "$tmp/ad" --prompt "the quick" --tokens 24 --temperature 0
cp "$tmp/out" "$tmp/g1"
expect "generate merged" "$bin" generate --model "$M" --weights "$tmp/merged.st" --prompt "the quick" --tokens 24 --temperature 0
cmp -s "$tmp/g1" "$tmp/out" && [ -s "$tmp/out" ] && ok || no "generate: --adapter and merged differ: $(cat "$tmp/g1") / $(cat "$tmp/out")"
# further training from the saved adapters
expect "train from --adapter" run --steps 5 --init "$tmp/base.st" --adapter "$tmp/ad"

# resume bit for bit (adapter dropout: the masks follow the step counter)
D=(--lora r=4,alpha=8,dropout=0.1,target=attn.c_attn,mlp.c_fc)
expect "uninterrupted" run --steps 20 --init "$tmp/base.st" "${D[@]}"
cp "$tmp/out" "$tmp/full.json"
expect "first half" run --steps 10 --init "$tmp/base.st" "${D[@]}" --save "$tmp/half.st"
expect "resumed" run --steps 20 "${D[@]}" --resume "$tmp/half.st"
[ "$(val "$tmp/full.json")" = "$(val "$tmp/out")" ] && ok || no "resume: $(val "$tmp/full.json") vs $(val "$tmp/out")"
expect_fail "resume with other --lora" 1 "--lora r=2,alpha=8,dropout=0.10000000000000001 differs from the checkpoint's r=4" \
    run --steps 20 --lora r=2,alpha=8,dropout=0.1,target=attn.c_attn,mlp.c_fc --resume "$tmp/half.st"
expect_fail "resume without --lora" 1 "--lora none differs from the checkpoint's r=4" run --steps 20 --resume "$tmp/half.st"

# bad input: exit 1, the option, the layer and the fault named, nothing written
mkdir "$tmp/w"
bad() { # description, text, args...
    local d=$1 pat=$2; shift 2
    expect_fail "$d" 1 "$pat" run --steps 2 --init "$tmp/base.st" --save "$tmp/w/ck.st" --save-adapter "$tmp/w/ad" "$@"
    [ -z "$(ls -A "$tmp/w")" ] && ok || no "$d: left $(ls "$tmp/w")"
}
bad "a target matching no layer" "--lora target 'c_atn' matches no linear layer (the model's linear layers: transformer.h.0.attn.c_attn" --lora r=4,target=c_atn
bad "a rank past a layer" "--lora r=33: layer transformer.h.0.attn.c_proj is 32 x 32 (out x in): the rank can be at most 32" --lora r=33,target=c_proj
bad "--lora with --freeze" "--lora freezes every base parameter itself: drop --freeze" --lora r=4,target=c_fc --freeze transformer.h.0
bad "--lora and --adapter" "give --lora or --adapter, not both" --lora r=4,target=c_fc --adapter "$tmp/ad"
# an adapter of another rank: the config's r against the tensors
mkdir "$tmp/bad"
cp "$tmp/ad/adapter_model.safetensors" "$tmp/bad/"
sed 's/"r": 4/"r": 8/' "$tmp/ad/adapter_config.json" >"$tmp/bad/adapter_config.json"
bad "an adapter of another rank" "lora_A of transformer.h.0.attn.c_attn is (4, 32): rank 4, the config's r is 8" --adapter "$tmp/bad"
# an adapter for another model: a wider base
sed 's/^embedding 256 32 /embedding 256 48 /; s/pos_embedding 32 /pos_embedding 32 /; s/layernorm 32/layernorm 48/; s/linear 32 /linear 48 /' "$M" >"$tmp/wide.model"
expect "a wider model's base" "$bin" train --model "$tmp/wide.model" --data "$tmp/text.txt" --batch 8 --steps 1 --save "$tmp/wbase.st" --save-weights-only
expect_fail "an adapter for another model" 1 "lora_A of transformer.h.0.attn.c_attn is (4, 32): the model's layer takes 48 inputs" \
    "$bin" eval --model "$tmp/wide.model" --data "$tmp/text.txt" --weights "$tmp/wbase.st" --adapter "$tmp/ad" --batch 8
sed 's/"peft_type": "LORA"/"peft_type": "LORA",/' "$tmp/ad/adapter_config.json" >"$tmp/bad/adapter_config.json"
bad "a malformed config" "adapter_config.json: byte" --adapter "$tmp/bad"
expect_fail "--merge without adapters" 1 "--merge $tmp/w/m.st: the model has no LoRA adapters (give --lora or --adapter)" \
    run --steps 2 --merge "$tmp/w/m.st"
expect_fail "eval --merge without adapters" 1 "--merge $tmp/w/m.st: the model has no LoRA adapters to merge" \
    "$bin" eval --model "$M" --data "$tmp/text.txt" --weights "$tmp/base.st" --merge "$tmp/w/m.st" --batch 8
[ -z "$(ls -A "$tmp/w")" ] && ok || no "--merge without adapters: left $(ls "$tmp/w")"
finish
