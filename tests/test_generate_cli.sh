#!/usr/bin/env bash
# test_generate_cli.sh — `frugal generate` as a user meets it: a small byte
# GPT trained for a few seconds on one repeated sentence, then text streamed
# from it. Checked: the prompt then exactly --tokens new bytes on stdout; the
# same seed the same bytes, greedy (temperature 0) continuing the sentence it
# learnt; tokens/s and the kv cache bytes (2 layers x K, V x 32 positions x 32
# x 4 bytes = 16384, worked out by hand) on stderr; a prompt longer than the
# context cropped with a note naming the count; ids: prompts; and the bad
# inputs: no --weights, a model that does not read tokens, an id past the
# vocabulary, a malformed ids: list.
source "$(dirname "$0")/lib.sh"

cp "$src/tests/data/small_gpt.model" "$tmp/g.model" # 2 layers, context 32, d 32
python3 - "$tmp/text.txt" <<'PY'
import sys
open(sys.argv[1], "w").write("the quick brown fox jumps over the lazy dog. " * 1000)
PY
"$bin" train --model "$tmp/g.model" --data "$tmp/text.txt" --batch 16 --threads 2 --steps 80 \
    --lr 1e-2 --optimizer adamw --test-limit 8 --save "$tmp/g.st" >/dev/null 2>"$tmp/t.err" ||
    no "train the small GPT: $(tail -2 "$tmp/t.err")"

gen() { "$bin" generate --model "$tmp/g.model" --weights "$tmp/g.st" --threads 2 "$@"; }

# ---- the stream ----
gen --prompt 'the quick ' --tokens 40 --seed 3 >"$tmp/a.out" 2>"$tmp/a.err" || no "generate: $(cat "$tmp/a.err")"
gen --prompt 'the quick ' --tokens 40 --seed 3 >"$tmp/b.out" 2>/dev/null
python3 - "$tmp/a.out" "$tmp/b.out" "$tmp/a.err" >"$tmp/r" 2>&1 <<'PY' && ok || no "stream: $(cat "$tmp/r")"
import re, sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
err = open(sys.argv[3]).read()
assert a.startswith(b"the quick "), a[:20]
assert len(a) == len("the quick ") + 40 + 1 and a.endswith(b"\n"), len(a)  # prompt, 40 bytes, newline
assert a == b, "the same seed gave other bytes"
assert re.search(r"40 tokens in [0-9.]+ s: [0-9.]+ tokens/s", err), err
assert "kv_cache 16.0 KiB (16384 bytes)" in err, err
PY
gen --prompt 'the quick ' --tokens 40 --seed 4 >"$tmp/c.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/c.out" && no "another seed gave the same 40 bytes" || ok

# greedy continues the sentence it learnt, across a context wrap (10 + 60 > 32)
gen --prompt 'the quick ' --tokens 60 --temperature 0 >"$tmp/g.out" 2>"$tmp/g.err" || no "greedy: $(cat "$tmp/g.err")"
grep -qF "the quick brown fox jumps over the lazy dog" "$tmp/g.out" && ok ||
    no "greedy did not continue the learnt sentence: $(cat "$tmp/g.out")"

# a prompt of 50 bytes: the context (32) keeps the last 32, 18 dropped
gen --prompt "$(printf 'the quick brown fox jumps over the lazy dog. the')" --tokens 5 \
    --temperature 0 >"$tmp/l.out" 2>"$tmp/l.err" || no "long prompt: $(cat "$tmp/l.err")"
grep -qF "the prompt has 48 tokens, the context 32: the first 16 are dropped" "$tmp/l.err" && ok ||
    no "long prompt note: $(cat "$tmp/l.err")"

# ids: a byte model takes them too (116 104 101 = "the"), and prints bytes
gen --prompt ids:116,104,101 --tokens 4 --temperature 0 >"$tmp/i.out" 2>"$tmp/i.err" || no "ids: $(cat "$tmp/i.err")"
head -c 3 "$tmp/i.out" | grep -qx "the" && ok || no "ids prompt echoed: $(cat "$tmp/i.out")"

# ---- bad input ----
expect_fail "no --weights" 2 "--weights CKPT is required" \
    "$bin" generate --model "$tmp/g.model" --prompt x
expect_fail "a model without token input" 1 "does not read tokens" \
    "$bin" generate --model mlp --weights "$tmp/g.st" --prompt x
expect_fail "missing weights file" 1 "$tmp/none.st" \
    "$bin" generate --model "$tmp/g.model" --weights "$tmp/none.st" --prompt x
expect_fail "an id past the vocabulary" 1 "prompt token 1 is id 300, outside the vocabulary [0, 256)" \
    gen --prompt ids:5,300 --tokens 3
expect_fail "a malformed ids list" 2 "expected token ids separated by commas" \
    gen --prompt ids:5,,7 --tokens 3
expect_fail "ids past int32" 2 "expected token ids separated by commas" \
    gen --prompt ids:99999999999 --tokens 3
finish
