#!/usr/bin/env bash
# Packs what gpu_checks.sh needs into .gpu/ (git-ignored; name it in the device tool's `carry`):
# the CUDA build's `mdsd`, `bench` and the engine's test binary, stripped, in bins.tar.xz, and the
# headers of the default pair's GGUF files (t15.skel.gguf, d05.skel.gguf), from which
# `bench random-gguf` writes random-weight copies there. Run from the repository root after the
# CUDA build (see gpu_checks.sh); TARGET defaults to target-cuda.
set -eu
T=${TARGET:-target-cuda}/release
G=.gpu
mkdir -p $G /tmp/mdsd-pack
rm -f /tmp/mdsd-pack/*
for b in mdsd bench; do strip -o /tmp/mdsd-pack/$b $T/$b; done
# The engine's integration tests are one binary (tests/it); cargo names it `it-HASH`, as it
# names the other crates' test binaries, so ask cargo which one is the engine's.
f=$(CARGO_TARGET_DIR=${TARGET:-target-cuda} cargo test --release --features cuda -p engine --test it --no-run \
  --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "it":
        print(m["executable"])')
strip -o /tmp/mdsd-pack/engine-tests "$f"
# One long dictionary: the binaries share most of their bytes (the CUDA kernels).
tar -cf - -C /tmp/mdsd-pack . | xz -T1 --lzma2=preset=6,dict=${XZ_DICT:-768MiB} > $G/bins.tar.xz
# OLD=DIR: that folder's mdsd and bench (an earlier build, stripped) go in old.tar.xz, for
# gpu_checks.sh's `ab` step.
if [ -n "${OLD:-}" ]; then
  tar -cf - -C "$OLD" mdsd bench | xz -T1 --lzma2=preset=6,dict=256MiB > $G/old.tar.xz
else
  rm -f $G/old.tar.xz
fi
CACHE=${MDSD_CACHE:-$HOME/.cache/mdsd}
BENCH=${BENCH:-target/release/bench}
[ -f $G/t15.skel.gguf ] || $BENCH random-gguf --like $CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --skeleton $G/t15.skel.gguf
[ -f $G/d05.skel.gguf ] || $BENCH random-gguf --like $CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --skeleton $G/d05.skel.gguf
# SHIP=1: SmolLM2-135M (real weights, 98 MB: more than one call carries) in parts of 20 MiB in
# .ship/ (git-ignored), to carry one or two per call; gpu_checks.sh's `ship` step joins them.
if [ -n "${SHIP:-}" ]; then
  rm -rf .ship && mkdir -p .ship
  split -b 20M -d -a 2 $CACHE/SmolLM2-135M-Instruct.Q4_1.gguf .ship/smollm2.gguf.part
  ls -la .ship
fi
ls -la /tmp/mdsd-pack $G
du -sh $G
