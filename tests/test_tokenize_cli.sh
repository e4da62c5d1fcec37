#!/usr/bin/env bash
# test_tokenize_cli.sh — `frugal tokenize`: the shard it writes holds the
# header words llm.c's format has (magic 20240520, version 1, the count) and
# exactly BOS followed by the ids encoder.py's algorithm gives the fortunes
# text (tests/data/tok/bpe_cases.txt); a file of over 1 MiB, read in chunks,
# gives the ids of the whole text (the fortunes text 60 times: its ids 60
# times, as the text ends in a newline before a letter); --shard-tokens cuts
# shards; `frugal train` reads the shards back; and refusals: missing
# options, a tokenizer of more than 65536 ids, an earlier run's shards.
source "$(dirname "$0")/lib.sh"
fort=/usr/share/games/fortunes/fortunes
tok=$src/tests/data/tok/bpe/vocab.json
# the reference ids of the fortunes text, one a line
awk '/^case /{c=$2} c=="fortunes" && /^ids [0-9]+$/{getline; gsub(/ /, "\n"); print; exit}' \
    "$src/tests/data/tok/bpe_cases.txt" >"$tmp/ref"
n=$(wc -l <"$tmp/ref")
[ "$n" -gt 5000 ] && ok || no "reference ids: $n"

# words of the header (int32) and the tokens (uint16) of a shard, one a line
header() { od -An -v -t d4 -N 12 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
tokens() { od -An -v -t u2 -j 1024 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }

expect "tokenize fortunes" "$bin" tokenize --tokenizer "$tok" --data "$fort" --out "$tmp/a" --json
grep -q '"kind": "bpe", "vocab": 557, "bos": 556, "files": 1, "bytes": 24516' "$tmp/out" && ok ||
    no "summary: $(cat "$tmp/out")"
{ echo 20240520; echo 1; echo $((n + 1)); } >"$tmp/want_h"
header "$tmp/a/tokens_000000.bin" >"$tmp/h"
cmp -s "$tmp/h" "$tmp/want_h" && ok || no "header: $(tr '\n' ' ' <"$tmp/h")"
{ echo 556; cat "$tmp/ref"; } >"$tmp/want"
tokens "$tmp/a/tokens_000000.bin" >"$tmp/got"
cmp -s "$tmp/got" "$tmp/want" && ok || no "the shard's tokens are not BOS + encoder.py's ids"
size=$(stat -c %s "$tmp/a/tokens_000000.bin")
[ "$size" -eq $((1024 + 2 * (n + 1))) ] && ok || no "shard size $size"

# over 1 MiB: chunks cut after newlines give the whole text's ids
for i in $(seq 60); do cat "$fort"; done >"$tmp/big.txt"
expect "tokenize 1.4 MB" "$bin" tokenize --tokenizer "$tok" --data "$tmp/big.txt" --out "$tmp/b" --no-bos --quiet
for i in $(seq 60); do cat "$tmp/ref"; done >"$tmp/want_big"
tokens "$tmp/b/tokens_000000.bin" >"$tmp/got_big"
cmp -s "$tmp/got_big" "$tmp/want_big" && ok || no "chunked encoding differs from the whole text's ids"

# shards of 4000 tokens: ceil((n + 1) / 4000) of them, the same tokens in order
expect "tokenize in shards" "$bin" tokenize --tokenizer "$tok" --data "$fort" --out "$tmp/c" --shard-tokens 4000 --quiet
want_shards=$(((n + 1 + 3999) / 4000))
[ "$(ls "$tmp/c" | wc -l)" -eq "$want_shards" ] && ok || no "shards: $(ls "$tmp/c" | tr '\n' ' ')"
for f in "$tmp"/c/tokens_*.bin; do tokens "$f"; done >"$tmp/got_c"
cmp -s "$tmp/got_c" "$tmp/want" && ok || no "the shards together are not the tokens"
header "$tmp/c/tokens_000000.bin" | sed -n 3p | grep -qx 4000 && ok || no "first shard's count"

# the shards are training data
printf '%s\n' "input tokens 32" "embedding 557 32 name=wte" "pos_embedding 32 name=wpe" \
    "layernorm 32 name=ln_f" "linear 557 bias=false tie=wte name=lm_head" "loss cross_entropy" >"$tmp/lm.model"
expect "train reads the shards" "$bin" train --model "$tmp/lm.model" --data "$tmp/a" --steps 2 --batch 2
# SentencePiece
expect "tokenize with SentencePiece" "$bin" tokenize --tokenizer "$src/tests/data/tok/spm" --data "$fort" --out "$tmp/s" --json --quiet
grep -q '"kind": "sentencepiece", "vocab": 1000, "bos": 1' "$tmp/out" && ok || no "spm summary: $(cat "$tmp/out")"

# refusals
expect_fail "no --out" 2 "needs --tokenizer, --data and --out" "$bin" tokenize --tokenizer "$tok" --data "$fort"
expect_fail "bad option" 2 "unknown option '--bogus'" "$bin" tokenize --bogus
expect_fail "bad --shard-tokens" 2 "--shard-tokens '0'" "$bin" tokenize --tokenizer "$tok" --data "$fort" --out "$tmp/z" --shard-tokens 0
expect_fail "shards there already" 1 "holds tokens_000000.bin already" "$bin" tokenize --tokenizer "$tok" --data "$fort" --out "$tmp/a"
expect_fail "no tokenizer" 1 "--tokenizer $tmp/none: no such tokenizer file" "$bin" tokenize --tokenizer "$tmp/none" --data "$fort" --out "$tmp/z"
expect_fail "no data" 1 "--data $tmp/none" "$bin" tokenize --tokenizer "$tok" --data "$tmp/none" --out "$tmp/z"
mkdir -p "$tmp/v"
awk 'BEGIN { printf "{"; for (b = 0; b < 256; b++) {
        p = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174
        cp = p ? b : 256 + k++; printf "%s\"\\u%04x\": %d", b ? ", " : "", cp, b }
    for (i = 256; i < 70000; i++) printf ", \"t%d\": %d", i, i; print "}" }' >"$tmp/v/vocab.json"
: >"$tmp/v/merges.txt"
expect_fail "70000 ids" 1 "70000 ids do not fit llm.c's uint16 shards" "$bin" tokenize --tokenizer "$tmp/v" --data "$fort" --out "$tmp/z"
[ ! -e "$tmp/z/tokens_000000.bin" ] && ok || no "a refused run left a shard"
finish
