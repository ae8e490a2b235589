#!/usr/bin/env bash
# CUDA checks and timings on a GPU machine with no Rust and no hub access (see
# benches/RESULTS.md, "CUDA"). Build here with
#   source ../shared/tools/cuda-toolchain.sh
#   CARGO_TARGET_DIR=target-cuda RUSTFLAGS="-C target-cpu=x86-64-v3" \
#     cargo build --release --features cuda -p engine -p bench
#   CARGO_TARGET_DIR=target-cuda RUSTFLAGS="-C target-cpu=x86-64-v3" \
#     cargo test --release --features cuda -p engine --no-run
# copy (and strip) `mdsd`, `bench` and the test binaries decode-*, model_forward-*, eagle-*
# into one folder BIN (named decode, model_forward, eagle), then on the GPU machine:
#   bash benches/cuda/gpu_checks.sh BIN OUT [steps]      steps: tests models gen cost (default all)
# Needs python3 with torch and safetensors there (random-weight checkpoints, see random_qwen2.py).
set -u
B=$1
O=$2
STEPS=${3:-"tests models gen cost"}
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$(ls -d "$SP"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$O/gpu.txt"
has() { [[ " $STEPS " == *" $1 "* ]]; }

if has tests; then
  # The engine's exactness tests (T=0 equality for every tree and pair, chi-square of the
  # first two tokens, tree-node logits, EAGLE) on CUDA, in f32 and in bf16.
  for dt in f32 bf16; do
    for t in model_forward decode eagle; do
      echo "== MDSD_TEST_DEVICE=cuda MDSD_TEST_DTYPE=$dt $t"
      MDSD_TEST_DEVICE=cuda MDSD_TEST_DTYPE=$dt "$B/$t" 2>&1 | grep -E "^test |test result|panicked|assert" | head -40
    done
  done 2>&1 | tee "$O/tests.txt"
fi

M=/tmp/mdsd-models
if has models; then
  mkdir -p $M
  [ -d $M/t15 ] || python3 benches/cuda/random_qwen2.py $M/t15 --shape 1.5b --out-std 0.0005
  [ -d $M/d05 ] || python3 benches/cuda/random_qwen2.py $M/d05 --shape 0.5b --seed 1
fi

PROMPT=$(python3 -c 'print(" ".join(f"t{(i*7919)%150000+1}" for i in range(64)))')
# One JSON line per run (`null` when it failed; stderr goes to $O/errors.txt).
gen() {
  local r
  r=$("$B/mdsd" generate --target $M/t15 --device cuda --prompt "$PROMPT" --json "$@" 2>>"$O/errors.txt" | tail -1)
  echo "${r:-null}"
}
if has gen; then
  : > "$O/gen.jsonl"
  gen --no-spec --max-new-tokens 8 > /dev/null # warm-up: CUDA context and kernel loading
  # f32 at T=0: the target's numerics do not depend on the batch, so every speculative run
  # must print the no-spec text exactly. bf16: the speed configuration.
  for dt_temp in "f32 0" "bf16 0" "bf16 0.7"; do
    read -r dt temp <<<"$dt_temp"
    {
      echo "{\"dtype\":\"$dt\",\"temperature\":$temp,\"method\":\"no-spec\",\"result\":$(gen --dtype $dt --no-spec --temperature $temp --max-new-tokens 128)}" >> "$O/gen.jsonl"
      for tree in chain-2 chain-4 drafts-2-depth-4 mc_sim_7b_63; do
        for m in greedy wr topk; do
          # At T=0 a multi-draft tree needs q at a temperature to have distinct drafts.
          dtemp=()
          [[ $temp == 0 && $tree != chain-* ]] && dtemp=(--draft-temperature 1)
          r=$(gen --dtype $dt --temperature $temp --max-new-tokens 128 --draft $M/t15 --draft-layers 4 --tree $tree --draft-sampling $m "${dtemp[@]}")
          echo "{\"dtype\":\"$dt\",\"temperature\":$temp,\"method\":\"$m\",\"tree\":\"$tree\",\"draft\":\"t15 first 4 layers\",\"result\":$r}" >> "$O/gen.jsonl"
        done
      done
      r=$(gen --dtype $dt --temperature $temp --max-new-tokens 128 --draft $M/d05 --tree chain-2)
      echo "{\"dtype\":\"$dt\",\"temperature\":$temp,\"method\":\"greedy\",\"tree\":\"chain-2\",\"draft\":\"d05\",\"result\":$r}" >> "$O/gen.jsonl"
    }
  done
  python3 benches/cuda/summarize_gen.py "$O/gen.jsonl" | tee "$O/gen.md"
fi

if has cost; then
  for dt in bf16; do
    "$B/bench" forward-cost --target $M/t15 --draft $M/d05 --device cuda --ks 1,2,4,8,16,32,64,128 --reps 5 2>&1 | tee "$O/forward-cost.txt"
  done
fi
