#!/usr/bin/env bash
# Record the operator traces `llada sim --experiment …` replays (docs/sim.md), into DIR.
# Usage: scripts/sim_traces.sh DIR [LLADA]   (LLADA: the binary, default target/release/llada)
# About 3 minutes on a 2-core machine. It also writes DIR/host.json, a host profile measured
# beside the traces (`llada sim --profile DIR/host.json DIR/ar.jsonl`). Greedy everywhere, so the schedules are reproducible.
set -euo pipefail
dir=${1:?usage: scripts/sim_traces.sh DIR [LLADA]}
llada=${2:-target/release/llada}
mkdir -p "$dir"
# The host profile, measured in the same minute as the traces (this machine's speed drifts).
"$llada" bench --json --reps 3 --trace "$dir/bench-decode.jsonl" >"$dir/bench.json"
"$llada" generate -t 0 -n 4 --mem-budget 25% --raw "Once upon a time" --trace "$dir/bench-stream.jsonl" >/dev/null
"$llada" generate -t 0 -n 1 --raw "$(printf 'It was a bright cold day in April, and the clocks were striking thirteen. %.0s' {1..8})" \
  --trace "$dir/bench-prefill.jsonl" >/dev/null
"$llada" sim --calibrate-host "$dir/bench.json" "$dir/bench-decode.jsonl" "$dir/bench-prefill.jsonl" \
  "$dir/bench-stream.jsonl" >"$dir/host.json"
run() { local name=$1; shift; echo "$name" >&2; "$llada" generate "$@" --trace "$dir/$name.jsonl" --json >"$dir/$name.out"; }

# llada.cpp: diffusion strategies on the shipped LLaDA-format task model, 64 answer tokens;
# AR on the default model, 64 tokens (the Llama-3-8B comparison re-costs its schedule).
sort_prompt="sort:3 1 4 1 5 9 2 6 5 3 5 8 9 7 9 3 2 3 8 4 6 2 6 4 3 3 8 3 2 7="
for s in prefix full multi-block revision vanilla; do
  run "diffusion-$s" --mode diffusion -m models/tiny-llada-tasks --raw "$sort_prompt" --gen-length 64 --strategy "$s"
done
run ar -t 0 -n 64 "Write a short story about a lighthouse keeper."

# Lever: target streamed at a 25 % weight budget, prompt-lookup + draft model, 64 tokens.
spec=(-t 0 -n 64 --mem-budget 25% "Write a short story about a lighthouse keeper.")
run lever-ar "${spec[@]}"
run lever-chain --mode speculative --draft ngram+models/smollm2-draft --tree chain "${spec[@]}"
run lever-tree --mode speculative --draft ngram+models/smollm2-draft --tree lever "${spec[@]}"
run lever-ee --mode speculative --draft ngram+models/smollm2-draft --tree lever --early-exit "${spec[@]}"

# AHASD: resident target, one verifier thread (TVC needs a core of its own), 64 tokens.
ah=(-t 0 -n 64 --threads 1 --mode speculative --draft models/smollm2-draft "Write a short story about a lighthouse keeper.")
run ahasd-sync --ahasd sync "${ah[@]}"
run ahasd-async --ahasd async "${ah[@]}"
run ahasd-edc --ahasd async --edc "${ah[@]}"
run ahasd-tvc --ahasd async --edc --tvc "${ah[@]}"

# Calibration extras: a prefill (long prompt, one token).
run prefill -t 0 -n 1 --raw "$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..20})"
