#!/usr/bin/python3
"""tok_bench.py — the Python reference's tokenizer throughput, beside
bench_tok (bench/tokenizer.sh runs both): byte-level BPE through
tests/ref/tok_ref.py's Encoder (OpenAI's encoder.py algorithm, in pure
Python, with its piece cache) and SentencePiece through python3-sentencepiece
(the same C++ library frugal calls). The first encode is cold (a fresh
encoder), the next R warm (median). One JSON line.

usage: tok_bench.py bpe VOCAB_JSON MERGES_TXT TEXT [R]
       tok_bench.py spm MODEL TEXT [R]
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))


def main():
    kind = sys.argv[1]
    if kind == "bpe":
        import tok_ref
        vocab = json.load(open(sys.argv[2], encoding="utf-8"))
        lines = open(sys.argv[3], encoding="utf-8").read().split("\n")
        merges = [tuple(l.split(" ")) for l in lines if l and not l.startswith("#version")]
        path, rest = sys.argv[4], sys.argv[5:]
        t0 = time.perf_counter()
        enc = tok_ref.Encoder(vocab, merges)
        load = time.perf_counter() - t0
        encode, decode = enc.encode, enc.decode
    else:
        import sentencepiece as spm
        t0 = time.perf_counter()
        sp = spm.SentencePieceProcessor(model_file=sys.argv[2])
        load = time.perf_counter() - t0
        path, rest = sys.argv[3], sys.argv[4:]
        encode, decode = sp.encode, sp.decode
    reps = int(rest[0]) if rest else 10
    raw = open(path, "rb").read()
    text = raw.decode("utf-8")
    t0 = time.perf_counter()
    ids = encode(text)
    cold = time.perf_counter() - t0
    e, d = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ids = encode(text)
        e.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        decode(ids)
        d.append(time.perf_counter() - t0)
    mb = len(raw) / 1e6
    print(json.dumps({"impl": "python", "kind": "bpe" if kind == "bpe" else "sentencepiece",
                      "bytes": len(raw), "tokens": len(ids), "load_ms": round(load * 1e3, 2),
                      "encode_cold_mb_s": round(mb / cold, 3),
                      "encode_mb_s": round(mb / statistics.median(e), 3),
                      "decode_mb_s": round(mb / statistics.median(d), 3)}))


if __name__ == "__main__":
    main()
