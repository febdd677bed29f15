#!/usr/bin/env bash
# Check `llada sim --model-shape` against an executed run (docs/sim.md): a schedule that does
# not depend on the model's confidences (AR greedy with --ignore-eos; diffusion with the prefix
# cache, one token per step) is recorded on a tiny model and on a `llada synth` model of an 8B
# shape (first 2 layers), both with prompts of the same token count; the tiny trace re-costed
# at that shape is replayed on PROFILE and compared with the synth run's own wall time.
# Usage: scripts/sim_validate_8b.sh DIR [PROFILE] [LLADA]   (PROFILE: e.g. DIR/host.json from
# scripts/sim_traces.sh; default the built-in host)
set -euo pipefail
dir=${1:?usage: scripts/sim_validate_8b.sh DIR [PROFILE] [LLADA]}
profile=${2:-host}
llada=${3:-target/release/llada}
mkdir -p "$dir"
[ -f "$dir/llama8b-2l.gguf" ] || "$llada" synth --shape llama-8b --layers 2 -o "$dir/llama8b-2l.gguf"
[ -f "$dir/llada8b-2l.gguf" ] || "$llada" synth --shape llada-8b --layers 2 -o "$dir/llada8b-2l.gguf"
q() { "$llada" "$@" >/dev/null 2>&1; }
# AR: "The capital of France is" is 5 SmolLM2 tokens; "Paris" is 5 bytes of the synth's tokenizer.
q generate --raw -t 0 -n 16 --ignore-eos "The capital of France is" --trace "$dir/small-ar.jsonl"
q generate -m "$dir/llama8b-2l.gguf" --raw -t 0 -n 16 --ignore-eos "Paris" --trace "$dir/synth-ar.jsonl"
# Diffusion, prefix cache: both tokenizers read the prompt one character per token.
q generate --mode diffusion -m models/tiny-llada-tasks --raw "sort:3 1 4=" --gen-length 32 --strategy prefix --trace "$dir/small-prefix.jsonl"
q generate --mode diffusion -m "$dir/llada8b-2l.gguf" --raw "sort:3 1 4=" --gen-length 32 --strategy prefix --trace "$dir/synth-prefix.jsonl"
field() { python3 -c "import json,sys; print('%.3f' % json.load(sys.stdin)['$1'])"; }
echo "| schedule | projected s | synth replayed s | synth executed s | projected / executed |"
echo "|---|---|---|---|---|"
for pair in "ar llama-3-8b@2" "prefix llada-8b@2"; do
  set -- $pair
  p=$("$llada" sim -p "$profile" "$dir/small-$1.jsonl" --model-shape "$2" --weight-bits 4.5 --json | field predicted_total_s)
  r=$("$llada" sim -p "$profile" "$dir/synth-$1.jsonl" --json | field predicted_total_s)
  m=$("$llada" sim -p "$profile" "$dir/synth-$1.jsonl" --json | field measured_total_s)
  echo "| $1 ($2) | $p | $r | $m | $(python3 -c "print('%.2f' % ($p / $m))") |"
done
