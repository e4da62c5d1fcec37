#!/usr/bin/env bash
# deps.sh — install what frugal needs from Debian 12's packages, only what is
# missing. Sourced by run.sh and test.sh. Pass extra package names to add.
set -euo pipefail
# OpenCL (the device backend): headers, the ICD loader, CLBlast, PoCL (a CPU
# device, so the device tests run anywhere) and clinfo; MPI for many processes;
# oneDNN for bf16 GEMMs under mixed precision; tokenizers: libsentencepiece
# (SentencePiece models), sentencepiece (spm_train, which test_tok_spm runs)
# and PCRE2 (byte-level BPE's pre-tokenizer).
need=(build-essential cmake pkg-config libopenblas-openmp-dev zlib1g-dev dataset-fashion-mnist fortunes
      ocl-icd-opencl-dev opencl-headers libclblast-dev pocl-opencl-icd clinfo
      openmpi-bin libopenmpi-dev libdnnl-dev libsentencepiece-dev sentencepiece libpcre2-dev "$@")
missing=()
for p in "${need[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
