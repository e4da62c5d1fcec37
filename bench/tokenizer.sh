#!/usr/bin/env bash
# tokenizer.sh — tokenizer throughput (MB/s), frugal (bench_tok) against the
# Python reference (bench/tok_bench.py), on Debian's fortunes text, for both
# kinds: byte-level BPE (the 300-merge vocabulary of tests/data/tok/bpe,
# frugal's C against encoder.py's algorithm in Python) and SentencePiece
# (tests/data/tok/spm, libsentencepiece through frugal's shim against
# python3-sentencepiece over the same library). Writes bench/out/tokenizer.md.
#
# usage: bench/tokenizer.sh [BUILD_DIR]   (TEXT=file REPS=n to change them)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
text=${TEXT:-/usr/share/games/fortunes/fortunes}
reps=${REPS:-20}
out=bench/out/tokenizer.md
cmake --build "$build" -j2 --target bench_tok >/dev/null
# the fortunes text is 24 KB: 40 copies make a 1 MB text, so a run is not all clock noise
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 40); do cat "$text"; done >"$work/text.txt"
d=tests/data/tok
fb=$("$build/bench_tok" $d/bpe/vocab.json "$work/text.txt" "$reps")
pb=$(/usr/bin/python3 bench/tok_bench.py bpe $d/bpe/vocab.json $d/bpe/merges.txt "$work/text.txt" "$reps")
fs=$("$build/bench_tok" $d/spm/tokenizer.model "$work/text.txt" "$reps")
ps=$(/usr/bin/python3 bench/tok_bench.py spm $d/spm/tokenizer.model "$work/text.txt" "$reps")
field() { echo "$1" | sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p"; }
row() { # label, frugal json, python json
    local fe pe
    fe=$(field "$2" encode_mb_s) pe=$(field "$3" encode_mb_s)
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$(field "$2" tokens)" \
        "$(field "$2" encode_cold_mb_s)" "$fe" "$(field "$2" decode_mb_s)" \
        "$(field "$3" encode_cold_mb_s)" "$pe" \
        "$(awk -v a="$fe" -v b="$pe" 'BEGIN { printf "%.1fx", a / b }')"
}
{
    echo "# Tokenizer throughput"
    echo
    echo "$(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')."
    echo "Text: $text, 40 copies ($(stat -c %s "$work/text.txt") bytes); MB/s = 10^6 bytes of text a"
    echo "second; cold: the first encode on a fresh tokenizer; warm: the median of $reps more."
    echo "Single thread. Tokens must agree: frugal $(field "$fb" tokens) / Python $(field "$pb" tokens) (BPE),"
    echo "$(field "$fs" tokens) / $(field "$ps" tokens) (SentencePiece)."
    echo
    echo "| tokenizer | tokens | frugal encode cold | frugal encode warm | frugal decode | Python encode cold | Python encode warm | warm encode, frugal / Python |"
    echo "|---|---|---|---|---|---|---|---|"
    row "byte-level BPE (557 ids, 300 merges) vs encoder.py's algorithm" "$fb" "$pb"
    row "SentencePiece (BPE, 1000 pieces) vs python3-sentencepiece" "$fs" "$ps"
    echo
    echo "Raw lines:"
    echo
    echo '```'
    printf '%s\n%s\n%s\n%s\n' "$fb" "$pb" "$fs" "$ps"
    echo '```'
} >"$out"
cat "$out"
