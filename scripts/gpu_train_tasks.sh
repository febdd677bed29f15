#!/usr/bin/env bash
# Train the larger task models on one GPU: the LLaDA- and Dream-format models side by side (two
# processes; a small model leaves most of the GPU idle), MINUTES of training each, then each
# scores itself on its generator's held-out side (`llada eval` on this machine's CPU gives the
# reported figures). Writes OUT/llada and OUT/dream (config.json, model.safetensors,
# train_state.json; the tokenizer files are the task models' own: copy them from
# models/tiny-llada-tasks) and OUT/llada.log, OUT/dream.log.
#
# Sizes fit the zoo's 40 MB with the shipped models (f16: ≈ 5.8 + 5.2 MB).
#   usage: [PYTHON=python3] scripts/gpu_train_tasks.sh OUT [MINUTES] [EVAL_PER_TASK]
set -euo pipefail
out=${1:?usage: gpu_train_tasks.sh OUT [MINUTES]}
minutes=${2:-7}
eval_per_task=${3:-50}
here=$(dirname "$0")
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
common=(--minutes "$minutes" --save-every-s 90 --weights-only --eval-per-task "$eval_per_task"
        --log-every 500 --d-model 192 --layers 6 --heads 6 --batch-tokens 32768 --lr 1e-3)
"$py" "$here/train_tasks_torch.py" --format llada --out "$out/llada" "${common[@]}" \
    >"$out/llada.log" 2>&1 &
"$py" "$here/train_tasks_torch.py" --format dream --out "$out/dream" --seed 1 "${common[@]}" \
    >"$out/dream.log" 2>&1 &
status=0
wait -n || status=$?
wait -n || status=$?
tail -n 4 "$out/llada.log" "$out/dream.log"
exit "$status"
