#!/usr/bin/env bash
# estimate_ab.sh — every built-in model's estimate (three optimizers, fp32 and
# bf16-mixed, text and JSON), a plan under 24 MiB and a ZeRO 2 estimate on 4
# ranks, from one build: run it with two builds and diff the outputs (issue
# 22: the estimate output before and after the training floor's rebuild).
#
#   bash bench/estimate_ab.sh BUILD/frugal > out.txt
bin=$1
for m in mlp cnn resnet gpt-tiny gpt2 gpt2-xl; do
  for o in sgd adam adamw; do
    for p in fp32 bf16-mixed; do
      echo "== $m $o $p"; $bin estimate --model $m --optimizer $o --precision $p 2>&1
      echo "== $m $o $p json"; $bin estimate --model $m --optimizer $o --precision $p --json 2>&1
    done
  done
  echo "== $m plan 24MiB"; $bin plan --model $m --budget 24MiB 2>&1 | grep -v 'seconds\|ms\b'
  echo "== $m ranks"; $bin estimate --model $m --ranks 4 --zero 2 2>&1
done
