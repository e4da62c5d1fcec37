#!/usr/bin/env bash
# test_hf_cli.sh — `frugal generate` on Hugging Face model directories
# (tests/data/hf/, written by tests/ref/hf_ref.py): --model DIR builds the
# model from its config.json and loads its weights (model.safetensors, or the
# shards of model.safetensors.index.json) without --weights. Checked: greedy
# decoding (--temperature 0) of each reference prompt prints the prompt's ids
# then PyTorch's 10 argmax tokens (gen.prompt, gen.tokens of
# <name>.ref.safetensors), for llama-tiny, llama-tiny-rope3 (llama3 rope
# scaling, tied), llama-tiny-linear (linear rope scaling) and gpt2-tiny; the sharded copy of llama-tiny prints the
# same; a directory without config.json is refused naming it.
source "$(dirname "$0")/lib.sh"

hf="$src/tests/data/hf"
# "<prompt ids> <new ids>" per reference prompt, one line each, and the
# prompt as ids:a,b,... after a tab
refs() {
    python3 - "$src/tests" "$hf/$1.ref.safetensors" <<'PY'
import struct, sys
sys.path.insert(0, sys.argv[1])
import st_tools
t = st_tools.read(sys.argv[2])
def ids(name):
    dt, shape, b = t[name]
    assert dt == "I32" and len(shape) == 2, (name, dt, shape)
    v = struct.unpack("<%di" % (len(b) // 4), b)
    return [v[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]
for p, g in zip(ids("gen.prompt"), ids("gen.tokens")):
    print("%s\tids:%s" % (" ".join(map(str, p + g)), ",".join(map(str, p))))
PY
}

gen() { # dir prompt: the greedy continuation's ids on stdout
    "$bin" generate --model "$1" --prompt "$2" --tokens 10 --temperature 0 --threads 2
}

check() { # reference name, model directory
    local want prompt got
    refs "$1" >"$tmp/refs" || { no "$1: reading the reference"; return; }
    while IFS=$'\t' read -r want prompt; do
        if got=$(gen "$2" "$prompt" 2>"$tmp/err"); then
            [ "$got" = "$want" ] && ok || no "$2 --prompt $prompt: '$got', PyTorch's '$want'"
        else
            no "$2 --prompt $prompt failed: $(head -3 "$tmp/err")"
        fi
    done <"$tmp/refs"
}

for name in llama-tiny llama-tiny-rope3 llama-tiny-linear gpt2-tiny; do check "$name" "$hf/$name"; done
check llama-tiny "$hf/llama-tiny-sharded"

# a directory that is not a Hugging Face model
mkdir "$tmp/empty"
"$bin" generate --model "$tmp/empty" --prompt ids:1,2 --tokens 1 >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" -ne 0 ] && grep -qF "config.json" "$tmp/err" && ok ||
    no "a directory without config.json: exit $rc, stderr: $(head -3 "$tmp/err")"

finish
