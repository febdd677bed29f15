#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh clone:
#   1. numpy for the independent Python reference (tests/reference/),
#   2. the reference fixtures: tiny LLaDA/Dream/LLaMA/Qwen2 checkpoints + golden logits,
#   3. the default model (SmolLM2-135M-Instruct Q4_1) into the user cache via `llada fetch`,
#   4. formatting and lints, then every Rust test;
#   5. with --ci, the newcomer test (scripts/newcomer.sh): the README's commands run from a fresh
#      clone's installed binary, outside the clone, with an empty model cache.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c "import numpy" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check numpy
fi
python3 tests/reference/make_fixtures.py tests/fixtures
python3 tests/reference/selftest.py

cargo build --release -p llada-cli
cargo run --release --quiet -p llada-cli -- fetch smollm2

if [ "${1:-}" = "--ci" ] || [ -n "${LLADA_LINT:-}" ]; then
  cargo fmt --all -- --check
  cargo clippy --release --workspace --all-targets -- -D warnings
fi
cargo test --release --workspace
# The library's first screen of docs, run: every mode through the facade.
cargo run --release --quiet -p llada --example embed
if [ "${1:-}" = "--ci" ]; then
  scripts/newcomer.sh
fi
