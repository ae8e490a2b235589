#!/usr/bin/env bash
# CUDA checks and timings on a lent GPU machine, which has no Rust, cannot reach the hub, and
# takes at most 64 MiB per call (docs/results/README.md#const-cuda-call-limit). Build here with
#   source ../shared/tools/cuda-toolchain.sh
#   export CUDA_COMPUTE_CAP=90 CARGO_TARGET_DIR=target-cuda RUSTFLAGS="-C target-cpu=x86-64-v3"
#   cargo build --release --features cuda -p mdsd -p bench
#   cargo test --release --features cuda -p engine --test it --no-run
# then pack into .gpu/ (git-ignored; `carry` it):
#   bash benches/cuda/pack.sh       # stripped binaries (bins.tar.xz) and the default pair's
#                                   # GGUF headers (t15.skel.gguf, d05.skel.gguf)
# and on the GPU machine:
#   bash benches/cuda/gpu_checks.sh .gpu OUT [steps]     steps: ship tests models gen cost features ab eagle
# (`ab`: old against new binaries, with OLD=DIR given to pack.sh; `eagle`: a random EAGLE head's
# steps against the target's forwards). TESTS, TEST_SPLIT, TEST_TIMEOUT, DEADLINE, DEV, B, M,
# MODELS, NEW, EAGLE_TARGET and TEST_ONLY tune a run (see below).
#
# Real weights: SmolLM2-135M (98 MB) reaches the machine in parts (`SHIP=1 bash
# benches/cuda/pack.sh` writes .ship/smollm2.gguf.part00-04, 20 MiB each). Call 1 carries .gpu and
# part00, each later call two more parts (a warm machine keeps what earlier calls left; call
# again within its 30 s), every command beginning `mkdir -p /root/ship && mv .ship/* /root/ship/;`.
# The step `ship` joins them into $M/smollm2.gguf and checks its sha256; MODELS=smollm2 then runs
# `gen` on it, the draft being its own first 24 of 30 blocks (SmolLM2 has no smaller sibling
# here). Dry run on the CPU: DEV=cpu B=target/release SHIPPED=DIR MODELS=smollm2 NEW=16 ... 'ship gen'.
#
# Models there: random weights in real layouts. `t15`/`d05` (Hugging Face, bf16) come from
# random_qwen2.py; `t15q`/`d05q` are the default pair's GGUF files (Qwen2.5-Coder 1.5B and 0.5B,
# Q4_K_M: same metadata, tokenizer, chat template, tensor shapes and quantization types) with
# random weights, from `bench random-gguf --like` on the headers. Timings mean something;
# acceptance rates do not. At most 8 files come back: gpu.txt tests.txt gen.jsonl gen.md
# cost.txt features.txt errors.txt (and the caller's log).
set -u
G=$1
O=$2
STEPS=${3:-"tests models gen eagle cost peer features summary"}
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$(ls -d "$SP"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
# DEV, B (binaries), M (models), MODELS and NEW (tokens per run) may be set for a dry run on
# the CPU: DEV=cpu B=target/release MODELS=t15q NEW=16 bash benches/cuda/gpu_checks.sh .gpu OUT 'gen features'
DEV=${DEV:-cuda}
B=${B:-/tmp/mdsd-bin}
M=${M:-/tmp/mdsd-models}
MODELS=${MODELS:-"t15 t15q"}
NEW=${NEW:-128}
mkdir -p "$O" $B $M
[ -x $B/mdsd ] || tar -xJf "$G/bins.tar.xz" -C $B
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$O/gpu.txt"
has() { [[ " $STEPS " == *" $1 "* ]]; }
E="$O/errors.txt"
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
# Steps stop starting runs past these many seconds, so that one call fits the device tool's limit.
DEADLINE=${DEADLINE:-540}
before() { [ $(($(date +%s) - T0)) -lt $(($1 * DEADLINE / 540)) ]; }

# Test binaries run at once (tiny models: launch-bound, so they overlap well), in the
# background while the models are written; `wait_tests` collects them.
TEST_PIDS=()
if has tests; then
  stamp "tests start"
  # The engine's tests are one binary (engine-tests); a "binary" below is a module of it, run
  # by its name as a filter (`decode::`).
  run_test() { # dtype module [extra args]
    local dt=$1 t=$2
    shift 2
    { MDSD_TEST_DEVICE=$DEV MDSD_TEST_DTYPE=$dt RUST_TEST_THREADS=4 timeout ${TEST_TIMEOUT:-$((240 * DEADLINE / 540))} "$B/engine-tests" "$t::" "$@" > "/tmp/test-$dt-$t.txt" 2>&1
      echo "exit $?" >> "/tmp/test-$dt-$t.txt"; } &
    TEST_PIDS+=($!)
  }
  # dtype:binary[:skipped,names] each.
  TESTS=${TESTS:-"f32:fused_decode bf16:fused_decode:equals_fused_plain,decode_as_eager f32:model_forward f32:decode f32:chi_square:one_percent f32:eagle f32:positional f32:logprobs f32:penalties f32:prefix_reuse f32:ngram f32:logit_bias f32:train_eagle bf16:model_forward bf16:eagle:follow_the_target_law,follows_the_target_law bf16:decode:follow_the_target_law,follows_the_target_law,are_exact"}
  if [ -n "${TEST_SPLIT:-}" ]; then
    # One process per test, TEST_SPLIT at a time, the chi-square tests (`law`, `exact`) first:
    # a binary's slowest test then bounds the step, not the sum of its tests.
    has_part() { # text comma,separated,parts: whether the text contains one of the parts
      local k
      for k in ${2//,/ }; do [[ "$1" == *"$k"* ]] && return 0; done
      return 1
    }
    for spec in $TESTS; do
      IFS=: read -r dt t skips <<<"$spec"
      "$B/engine-tests" "$t::" --list 2>/dev/null | sed -n 's/: test$//p' | while read -r name; do
        has_part "$name" "$skips" && continue
        # TEST_ONLY: comma-separated parts of `binary-name` to run (all when unset).
        [ -z "${TEST_ONLY:-}" ] || has_part "$t-$name" "$TEST_ONLY" || continue
        case "$name" in *law*|*exact*) rank=0 ;; *temperature_zero*) rank=1 ;; *) rank=2 ;; esac
        echo "$rank $dt $t $name"
      done
    done | sort -s -k1,1 > /tmp/test-list.txt
    stamp "$(wc -l < /tmp/test-list.txt) tests, $TEST_SPLIT at a time"
    one_test() { # dtype binary name
      local f="/tmp/test-$1-$2-$3.txt" s=$(date +%s.%N)
      MDSD_TEST_DEVICE=$DEV MDSD_TEST_DTYPE=$1 timeout ${TEST_TIMEOUT:-$((240 * DEADLINE / 540))} "$B/engine-tests" --exact "$3" --nocapture > "$f" 2>&1
      echo "exit $? after $(python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),1))" $s) s" >> "$f"
    }
    export -f one_test
    export DEV DEADLINE B TEST_TIMEOUT
    { awk '{print $2, $3, $4}' /tmp/test-list.txt | xargs -P "$TEST_SPLIT" -L 1 bash -c 'one_test "$@"' _; } &
    TEST_PIDS+=($!)
  else
    for spec in $TESTS; do
      IFS=: read -r dt t skips <<<"$spec"
      skip_args=()
      for k in ${skips//,/ }; do skip_args+=(--skip "$k"); done
      run_test $dt $t "${skip_args[@]}"
    done
  fi
fi
wait_tests() {
  [ ${#TEST_PIDS[@]} -gt 0 ] || return 0
  wait "${TEST_PIDS[@]}"
  for f in /tmp/test-*.txt; do
    [ "$f" = /tmp/test-list.txt ] && continue
    echo "== $(basename "$f" .txt)"
    grep -E "^test |test result|panicked|assert|worst|diff|tolerance|pruned|^exit " "$f" | grep -v "has been running" | head -80
  done > "$O/tests.txt"
  stamp "tests done"
}

if has ship; then
  stamp "ship start"
  SHIPPED=${SHIPPED:-/root/ship}
  if [ -f $M/smollm2.gguf ] || { ls $SHIPPED/smollm2.gguf.part* > /dev/null 2>&1 && cat $SHIPPED/smollm2.gguf.part* > $M/smollm2.gguf; }; then
    echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $M/smollm2.gguf" | sha256sum -c >> "$E" 2>&1 \
      || { echo "smollm2.gguf: parts missing or corrupt" >> "$E"; rm -f $M/smollm2.gguf; }
  else
    echo "ship: no parts in $SHIPPED" >> "$E"
  fi
  stamp "ship done"
fi

if has models; then
  stamp "models start"
  { [ -d $M/t15 ] || python3 benches/cuda/random_qwen2.py $M/t15 --shape 1.5b --out-std 0.0005
    [ -d $M/d05 ] || python3 benches/cuda/random_qwen2.py $M/d05 --shape 0.5b --seed 1; } >> "$E" 2>&1 &
  PY=$!
  [ -f $M/t15q.gguf ] || $B/bench random-gguf --like "$G/t15.skel.gguf" --out $M/t15q.gguf --out-std 0.0005 --tie-output >> "$E" 2>&1
  [ -f $M/d05q.gguf ] || $B/bench random-gguf --like "$G/d05.skel.gguf" --out $M/d05q.gguf --seed 1 >> "$E" 2>&1
  wait $PY
  ls -la $M $M/t15 >> "$E"
  stamp "models done"
fi
# Timings need the GPU to themselves.
wait_tests

WORDS=$(python3 -c 'print(" ".join(f"t{(i*7919)%150000+1}" for i in range(64)))')
TEXT="Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."
# One JSON line per run (`null` when it failed; stderr goes to errors.txt).
gen() { # label model prompt [mdsd flags]
  local label=$1 model=$2 prompt=$3 r
  shift 3
  before 420 || { echo "skipped (deadline): $label $*" >> "$E"; return; }
  r=$(timeout 60 "${MDSD:-$B/mdsd}" generate --target "$model" --device $DEV --prompt "$prompt" --json --ngram off --ignore-eos "$@" 2>>"$E" | tail -1)
  echo "{\"label\":\"$label\",\"args\":\"$*\",\"result\":${r:-null}}" >> "$O/gen.jsonl"
}
if has gen; then
  stamp "gen start"
  : > "$O/gen.jsonl"
  WARM=$M/t15
  [ -d $WARM ] || WARM=$M/smollm2.gguf
  gen warm-up $WARM "$WORDS" --no-spec --max-new-tokens 8 # CUDA context and kernel loading
  for model in $MODELS; do
    # Speed: the target's first 4 blocks as the draft (q close to p with random weights).
    case $model in
      t15) P=$WORDS; F=$M/t15; DA=(--draft $M/d05); DL=4 ;;
      # Real weights: the draft is the file's first 24 of 30 blocks (τ 1.56 on this prompt at
      # T = 0 on the CPU; 10 blocks gave 1.07), so steps accept drafts now and then.
      smollm2) [ -f $M/smollm2.gguf ] || continue; P=$TEXT; F=$M/smollm2.gguf; DA=(--draft $F --draft-layers 24); DL=24 ;;
      *) P=$TEXT; F=$M/t15q.gguf; DA=(--draft $M/d05q.gguf); DL=4 ;;
    esac
    N=(--max-new-tokens $NEW)
    S=(--draft "$F" --draft-layers $DL)
    for temp in 0 0.7; do
      gen "$model speed T=$temp" "$F" "$P" "${N[@]}" --temperature $temp --no-spec
      gen "$model speed T=$temp" "$F" "$P" "${N[@]}" --temperature $temp "${S[@]}" --tree chain-4 --draft-sampling wr
      gen "$model speed T=$temp" "$F" "$P" "${N[@]}" --temperature $temp "${S[@]}" --tree mc_sim_7b_63 --draft-sampling wr
    done
    gen "$model speed T=0" "$F" "$P" "${N[@]}" --temperature 0 "${S[@]}" --tree drafts-2-depth-4 --draft-sampling greedy --draft-temperature 1
    gen "$model speed T=0" "$F" "$P" "${N[@]}" --temperature 0 "${DA[@]}" --tree chain-4
    # CUDA graphs: the target's steps replayed (MDSD_CUDA_GRAPHS=1) against the same
    # device-kernel path eager, T = 0. Texts must be equal: gen.md compares each row with its
    # label's --no-spec text (and the two labels' no-spec texts must match); graph_forwards in
    # the JSON counts the replayed steps.
    for g in 0 1; do
      lab=fused; [ $g = 1 ] && lab=graphs
      MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=$g gen "$model $lab T=0" "$F" "$P" "${N[@]}" --temperature 0 --no-spec
      MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=$g gen "$model $lab T=0" "$F" "$P" "${N[@]}" --temperature 0 "${S[@]}" --tree chain-4 --draft-sampling wr
      MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=$g gen "$model $lab T=0" "$F" "$P" "${N[@]}" --temperature 0 "${DA[@]}" --tree mc_sim_7b_63
    done
    # Selection at T = 0.7 (and with top-p 0.9): the warp on the device (WarpRows, the default)
    # against the warp on the host (MDSD_DEVICE_WARP=0), on the device-kernel path with graphs. "verify ms/step" in
    # gen.md is the host's selection per step (row copies, warp, verification); the draft's
    # warps are in "draft ms/forward". device_warped_rows in the JSON counts the rows.
    if [ $model = t15q ]; then
      for w in 0 1; do
        lab=warp-host; [ $w = 1 ] && lab=warp-device
        MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=1 MDSD_DEVICE_WARP=$w gen "$model $lab T=0.7" "$F" "$P" "${N[@]}" --temperature 0.7 --no-spec
        MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=1 MDSD_DEVICE_WARP=$w gen "$model $lab T=0.7" "$F" "$P" "${N[@]}" --temperature 0.7 "${S[@]}" --tree chain-4 --draft-sampling wr
        MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=1 MDSD_DEVICE_WARP=$w gen "$model $lab T=0.7" "$F" "$P" "${N[@]}" --temperature 0.7 "${DA[@]}" --tree mc_sim_7b_63
        MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=1 MDSD_DEVICE_WARP=$w gen "$model $lab T=0.7" "$F" "$P" "${N[@]}" --temperature 0.7 --top-p 0.9 "${S[@]}" --tree chain-4 --draft-sampling wr
      done
    fi
    # Exactness at T = 0: a repetition penalty keeps the text from looping on one token, so
    # equal texts say something. f32 (HF) and dequantized f32 (GGUF) are batch-invariant.
    if [ $model = t15 ]; then X=(--dtype f32); else X=(--target-weights f32 --draft-weights f32); fi
    XP=(--temperature 0 --repetition-penalty 1.5 "${X[@]}")
    gen "$model exact" "$F" "$P" "${N[@]}" "${XP[@]}" --no-spec
    for tree in chain-4 mc_sim_7b_63; do
      for m in greedy wr topk; do
        gen "$model exact" "$F" "$P" "${N[@]}" "${XP[@]}" "${S[@]}" --tree $tree --draft-sampling $m --draft-temperature 1
      done
    done
    gen "$model exact" "$F" "$P" "${N[@]}" "${XP[@]}" "${DA[@]}" --tree drafts-2-depth-4 --draft-sampling wor --draft-temperature 1
    # The same at the speed configuration (bf16 / stored quantized weights): batch-dependent
    # rounding may legitimately change the text; recorded, not required.
    XP=(--temperature 0 --repetition-penalty 1.5)
    gen "$model exact-fast" "$F" "$P" "${N[@]}" "${XP[@]}" --no-spec
    gen "$model exact-fast" "$F" "$P" "${N[@]}" "${XP[@]}" "${S[@]}" --tree mc_sim_7b_63 --draft-sampling topk --draft-temperature 1
    # Reproducible sampling (positional races): the text depends on the seed only, not the tree.
    R=(--temperature 0.8 --seed 7 --reproducible --repetition-penalty 1.2)
    gen "$model reproducible" "$F" "$P" "${N[@]}" "${R[@]}" "${X[@]}" --no-spec
    gen "$model reproducible" "$F" "$P" "${N[@]}" "${R[@]}" "${X[@]}" "${S[@]}" --tree chain-4
    gen "$model reproducible" "$F" "$P" "${N[@]}" "${R[@]}" "${X[@]}" "${DA[@]}" --tree mc_sim_7b_63
  done
  python3 benches/cuda/summarize_gen.py "$O/gen.jsonl" > "$O/gen.md" 2>>"$E"
  stamp "gen done"
fi

# Old against new binaries ($G/old/{mdsd,bench}, extracted from old.tar.xz), alternated, on
# the HF model t15 (bf16): the forward cost split, and end-to-end rows.
if has ab && [ -f "$G/old.tar.xz" ]; then
  stamp "ab start"
  mkdir -p /tmp/mdsd-old && tar -xJf "$G/old.tar.xz" -C /tmp/mdsd-old
  : > "$O/gen.jsonl"
  gen warm-up $M/t15 "$WORDS" --no-spec --max-new-tokens 8
  for round in 1 2; do
    for which in old new; do
      if [ $which = old ]; then MDSD=/tmp/mdsd-old/mdsd; BENCH=/tmp/mdsd-old/bench; else MDSD=$B/mdsd; BENCH=$B/bench; fi
      S=(--draft $M/t15 --draft-layers 4 --max-new-tokens 128 --temperature 0)
      gen "$which T=0" $M/t15 "$WORDS" "${S[@]}" --no-spec
      gen "$which T=0" $M/t15 "$WORDS" "${S[@]}" --tree chain-4 --draft-sampling wr
      gen "$which T=0" $M/t15 "$WORDS" "${S[@]}" --tree mc_sim_7b_63 --draft-sampling topk --draft-temperature 1
      gen "$which T=0" $M/t15 "$WORDS" "${S[@]}" --tree drafts-2-depth-4 --draft-sampling greedy --draft-temperature 1
      if [ $round = 1 ]; then
        echo "== $which" >> "$O/cost.txt"
        timeout 40 $BENCH forward-cost --target $M/t15 --draft $M/d05 --device $DEV --ks 1,8,16,32,64 --reps 5 --breakdown >> "$O/cost.txt" 2>>"$E"
      fi
    done
  done
  unset MDSD
  if [ -f $M/t15q.gguf ]; then
    for tree in no-spec chain-4 mc_sim_7b_63; do
      t=(--tree $tree --draft-sampling topk --draft-temperature 1); [ $tree = no-spec ] && t=(--no-spec)
      gen "new t15q tied T=0" $M/t15q.gguf "$TEXT" --draft $M/t15q.gguf --draft-layers 4 --max-new-tokens 128 --temperature 0 "${t[@]}"
    done
  fi
  python3 benches/cuda/summarize_gen.py "$O/gen.jsonl" > "$O/gen.md" 2>>"$E"
  stamp "ab done"
fi

# EAGLE head steps against target forwards (the EAGLE issue's speed item): a head with random
# weights and the target's sizes (`bench random-eagle`), its output layer whole and cut to the
# first 32,768 ids (`--draft-vocab`, the default); T = 0, so the texts must equal no-spec's.
# EAGLE_TARGET: its target, a model folder or GGUF file (default: the random HF t15).
if has eagle && before 460; then
  stamp "eagle start"
  ET=${EAGLE_TARGET:-$M/t15}
  [ -d $M/e15 ] || $B/bench random-eagle --target "$ET" --out $M/e15 >> "$E" 2>&1
  [ -f "$O/gen.jsonl" ] || : > "$O/gen.jsonl"
  EP=$WORDS; [ -d "$ET" ] || EP=$TEXT
  gen "eagle T=0" "$ET" "$EP" --max-new-tokens $NEW --temperature 0 --no-spec
  for dv in 0 32768; do
    for tree in chain-1 chain-3 mc_sim_7b_63; do
      gen "eagle T=0" "$ET" "$EP" --max-new-tokens $NEW --temperature 0 --eagle $M/e15 --draft-vocab $dv --tree $tree
    done
  done
  # The head's and the target's steps replayed from CUDA graphs against the same path eager.
  for g in 0 1; do
    lab=fused; [ $g = 1 ] && lab=graphs
    MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=$g gen "eagle $lab T=0" "$ET" "$EP" --max-new-tokens $NEW --temperature 0 --no-spec
    for tree in chain-3 mc_sim_7b_63; do
      MDSD_FUSED_DECODE=1 MDSD_CUDA_GRAPHS=$g gen "eagle $lab T=0" "$ET" "$EP" --max-new-tokens $NEW --temperature 0 \
        --eagle $M/e15 --draft-vocab 32768 --tree $tree
    done
  done
  python3 benches/cuda/summarize_gen.py "$O/gen.jsonl" > "$O/gen.md" 2>>"$E"
  for dv in 0 32768; do
    echo "== EAGLE head, --draft-vocab $dv" >> "$O/cost.txt"
    timeout 60 $B/bench forward-cost --target "$ET" --eagle $M/e15 --device $DEV --ks 1,2,4,8,16 --reps 5 \
      --breakdown --draft-vocab $dv >> "$O/cost.txt" 2>>"$E"
  done
  stamp "eagle done"
fi

if has cost && before 470; then
  stamp "cost start"
  # Eager candle ops against the device kernels (MDSD_FUSED_DECODE), the costs also as JSON
  # for `bench predict` and gpu-latest.json.
  for fused in 0 1; do
    echo "== MDSD_FUSED_DECODE=$fused" >> "$O/cost.txt"
    MDSD_FUSED_DECODE=$fused timeout 40 "$B/bench" forward-cost --target $M/t15q.gguf --draft $M/d05q.gguf --draft-weights stored \
      --device $DEV --ks 1,2,4,8,16,32,64 --reps 5 --breakdown --json "$O/cost-t15q-fused$fused.json" >> "$O/cost.txt" 2>>"$E"
    [ -d $M/e15 ] && MDSD_FUSED_DECODE=$fused timeout 40 "$B/bench" forward-cost --target $M/t15q.gguf --eagle $M/e15 \
      --device $DEV --ks 1,2,4,8,16 --reps 5 --json "$O/cost-eagle-fused$fused.json" >> "$O/cost.txt" 2>>"$E"
  done
  timeout 40 "$B/bench" forward-cost --target $M/t15 --draft $M/d05 --device $DEV --ks 1,2,4,8,16,32,64 --reps 5 --breakdown >> "$O/cost.txt" 2>>"$E"
  # CUDA graph probe (`--graph`, engine::kernels::device::graph): each forward with its logits
  # captured once and replayed, its replay timed and its logits checked against the eager
  # forward's bit for bit; a capture that fails says why (in cost.txt's stderr, errors.txt,
  # and the JSON's graph_errors). Separate runs, so that a failing capture spoils no eager cost.
  for fused in 0 1; do
    echo "== graph probe, MDSD_FUSED_DECODE=$fused" >> "$O/cost.txt"
    MDSD_FUSED_DECODE=$fused timeout 60 "$B/bench" forward-cost --target $M/t15q.gguf --draft $M/d05q.gguf --draft-weights stored \
      --device $DEV --ks 1,2,4,8,16,32,64 --reps 5 --graph --json "$O/graph-t15q-fused$fused.json" >> "$O/cost.txt" 2>>"$E"
    [ -d $M/e15 ] && MDSD_FUSED_DECODE=$fused timeout 40 "$B/bench" forward-cost --target $M/t15q.gguf --eagle $M/e15 \
      --device $DEV --ks 1,2,4,8,16 --reps 5 --graph --json "$O/graph-eagle-fused$fused.json" >> "$O/cost.txt" 2>>"$E"
  done
  # The engine's one stream without event tracking (default) against candle's per-thread
  # stream with cudarc's events (two per allocation): MDSD_CUDA_STREAM=per-thread.
  echo "== MDSD_CUDA_STREAM=per-thread, MDSD_FUSED_DECODE=1" >> "$O/cost.txt"
  MDSD_CUDA_STREAM=per-thread MDSD_FUSED_DECODE=1 timeout 40 "$B/bench" forward-cost --target $M/t15q.gguf --draft $M/d05q.gguf \
    --draft-weights stored --device $DEV --ks 1,8,64 --reps 5 --json "$O/cost-t15q-perthread.json" >> "$O/cost.txt" 2>>"$E"
  # The device kernels' path joins each block's q/k/v and gate/up products into one matrix each
  # (engine::model::Products); MDSD_JOIN_PRODUCTS=0 keeps them apart, for the A/B.
  echo "== MDSD_JOIN_PRODUCTS=0, MDSD_FUSED_DECODE=1" >> "$O/cost.txt"
  MDSD_JOIN_PRODUCTS=0 MDSD_FUSED_DECODE=1 timeout 40 "$B/bench" forward-cost --target $M/t15q.gguf --draft $M/d05q.gguf \
    --draft-weights stored --device $DEV --ks 1,8,64 --reps 5 --json "$O/cost-t15q-apart.json" >> "$O/cost.txt" 2>>"$E"
  stamp "cost done"
fi

# The peer on the same GPU and files: llama.cpp's llama-bench (tg128, pp512) and
# llama-speculative with the 0.5B draft (PEERS: the unpacked llama-cpp-cuda-sm90 folder, from
# ../shared/peers/llama-cpp-cuda-sm90.tar.xz carried as .peers/).
if has peer && before 500; then
  stamp "peer start"
  PEERS=${PEERS:-/root/peers/llama-cpp-cuda-sm90}
  if [ ! -x $PEERS/llama-bench ] && [ -f .peers/llama-cpp-cuda-sm90.tar.xz ]; then
    mkdir -p /root/peers && tar xJf .peers/llama-cpp-cuda-sm90.tar.xz -C /root/peers
  fi
  if [ -x $PEERS/llama-bench ]; then
    CU=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)
    LD_LIBRARY_PATH=$PEERS:$CU:$LD_LIBRARY_PATH timeout 90 $PEERS/llama-bench -m $M/t15q.gguf -p 512 -n 128 -ngl 99 -fa 1 -o json \
      > "$O/llama-bench.json" 2>>"$E"
    LD_LIBRARY_PATH=$PEERS:$CU:$LD_LIBRARY_PATH timeout 90 $PEERS/llama-speculative -m $M/t15q.gguf -md $M/d05q.gguf -ngl 99 -ngld 99 \
      -p "$TEXT" -n 128 --draft-max 8 --temp 0 > "$O/llama-speculative.txt" 2>&1
  else
    echo "peer: no llama.cpp binaries at $PEERS (carry .peers/llama-cpp-cuda-sm90.tar.xz)" >> "$E"
  fi
  stamp "peer done"
fi

# gpu-latest.json: the commit, device, date, forward costs (ms), mdsd's and llama.cpp's tokens/s.
if has summary; then
  python3 benches/cuda/summarize_gpu.py "$O" > "$O/gpu-latest.json" 2>>"$E"
fi

if has features && before 500; then
  stamp "features start"
  {
    Q=$M/t15q.gguf
    echo "== generate --chat --logprobs 2 (T=0, chain-4)"
    timeout 60 $B/mdsd generate --target $Q --draft $M/d05q.gguf --tree chain-4 --device $DEV --chat --prompt "$TEXT" \
      --max-new-tokens 8 --temperature 0 --logprobs 2 --json | python3 -c 'import json,sys; d=json.loads(sys.stdin.read().splitlines()[-1]); print({k: d[k] for k in d if k in ("new_tokens","tau","prompt_tokens")}); print(json.dumps(d.get("logprobs"))[:600])'
    echo "== chat: two turns (prefix reuse)"
    printf 'Hello there\nAnd a second question\n' | timeout 60 $B/mdsd chat --target $Q --draft $M/d05q.gguf --tree chain-4 --device $DEV --max-new-tokens 16 --temperature 0 2>&1 | tail -12
    echo "== serve: completions, chat completions (stream), metrics"
    timeout 90 $B/mdsd serve --target $Q --draft $M/d05q.gguf --tree chain-4 --device $DEV --port 18080 > /tmp/serve.log 2>&1 &
    SV=$!
    python3 - <<'EOF'
import json, time, urllib.request
base = "http://127.0.0.1:18080"
for _ in range(120):
    try:
        urllib.request.urlopen(base + "/health", timeout=2).read(); break
    except Exception:
        time.sleep(0.5)
def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60).read().decode()
print(post("/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0})[:500])
s = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "stream": True, "temperature": 0.7, "seed": 3})
print(len([l for l in s.splitlines() if l.startswith("data:")]), "stream events; last:", s.strip().splitlines()[-1][:80])
print("\n".join(l for l in urllib.request.urlopen(base + "/metrics").read().decode().splitlines() if not l.startswith("#"))[:800])
EOF
    kill $SV; wait $SV 2>/dev/null
    tail -5 /tmp/serve.log
    echo "== draft window at T=0 (window 32): text equals no-spec"
    a=$(timeout 60 $B/mdsd generate --target $Q --device $DEV --prompt "$TEXT" --ignore-eos --max-new-tokens 96 --temperature 0 --repetition-penalty 1.5 --target-weights f32 --no-spec --json | tail -1)
    b=$(timeout 60 $B/mdsd generate --target $Q --draft $M/d05q.gguf --draft-window 32 --tree chain-4 --device $DEV --prompt "$TEXT" --ignore-eos --max-new-tokens 96 --temperature 0 --repetition-penalty 1.5 --target-weights f32 --json | tail -1)
    python3 -c 'import json,sys; a,b=(json.loads(x)["text"] for x in sys.argv[1:]); print("equal" if a==b else "DIFFERENT", len(a), len(b))' "$a" "$b"
  } > "$O/features.txt" 2>>"$E"
  stamp "features done"
fi
