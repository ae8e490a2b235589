#!/usr/bin/env bash
# Tokens/s of `mdsd generate` on a CPU shared with other busy processes, for one or more
# binaries run in turn (compare them as ratios from the same run).
#
#   bash benches/cpu/shared_cpu.sh [ROUNDS] BINARY...
#
# Scenarios: idle; one busy-looping process; one per core. Cases: the default pair with
# --no-spec (64 new tokens) and speculative with generate's defaults (64), and SmolLM2 Q4_1
# with --no-spec (128); all at temperature 0 on one prompt. Models from $MDSD_CACHE (default
# ~/.cache/mdsd; `mdsd fetch` and `mdsd fetch smollm2` provide them). Prints one line per run.
set -euo pipefail
rounds=${1:-2}; shift
[ $# -ge 1 ] || { echo "usage: $0 [ROUNDS] BINARY..." >&2; exit 2; }
cache=${MDSD_CACHE:-$HOME/.cache/mdsd}
smol=$cache/SmolLM2-135M-Instruct.Q4_1.gguf
prompt="Write a quicksort in Python"
cores=$(nproc)
tps() { python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])["tokens_per_s"],2))'; }
run_case() {
  local bin=$1 case=$2
  case $case in
    pair-nospec) "$bin" generate --temperature 0 --no-spec --prompt "$prompt" --max-new-tokens 64 --json 2>/dev/null | tps ;;
    pair-spec) "$bin" generate --temperature 0 --prompt "$prompt" --max-new-tokens 64 --json 2>/dev/null | tps ;;
    smol-nospec) "$bin" generate --temperature 0 --target "$smol" --no-spec --prompt "$prompt" --max-new-tokens 128 --json 2>/dev/null | tps ;;
  esac
}
hogs=()
start_hogs() { for _ in $(seq 1 "$1"); do (while :; do :; done) & hogs+=($!); done; }
stop_hogs() { for p in "${hogs[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; hogs=(); }
trap stop_hogs EXIT
for busy in 0 1 "$cores"; do
  stop_hogs; start_hogs "$busy"; sleep 1
  for r in $(seq 1 "$rounds"); do
    for case in pair-nospec pair-spec smol-nospec; do
      for bin in "$@"; do
        echo "busy=$busy round=$r case=$case bin=$bin tokens_per_s=$(run_case "$bin" "$case")"
      done
    done
  done
done
