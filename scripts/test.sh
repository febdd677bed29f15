#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh clone:
#   1. numpy for the independent Python reference (tests/reference/), gguf (llama.cpp's gguf-py)
#      to check converted files,
#   2. the reference fixtures: tiny LLaDA/Dream/LLaMA/Qwen2 checkpoints + golden logits,
#   3. the default model (SmolLM2-135M-Instruct Q4_1) and the Qwen2.5-Coder 0.5B/1.5B pair into
#      the user cache via `llada fetch`,
#   4. formatting and lints, then every Rust test, then `llada serve` through the official
#      `openai` Python client and its playground page in headless Chromium (tests/serve/);
#   5. with --ci, the newcomer test (scripts/newcomer.sh): the README's commands run from a fresh
#      clone's installed binary, outside the clone, with an empty model cache.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c "import numpy" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check numpy
fi
# llama.cpp's own GGUF reader (gguf-py), which checks what `llada convert` writes
# (tests/reference/check_convert.py, crates/llada-convert/tests/convert.rs).
if ! python3 -c "import gguf" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check gguf
fi
# The official OpenAI client, which tests/serve/openai_client.py drives `llada serve` with.
if ! python3 -c "import openai" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check openai
fi
# selenium drives headless Chromium through the playground page (tests/serve/browser_test.py).
if ! python3 -c "import selenium" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check selenium
fi
python3 tests/reference/make_fixtures.py tests/fixtures
python3 tests/reference/selftest.py

cargo build --release -p llada-cli
cargo run --release --quiet -p llada-cli -- fetch smollm2
# The real speculative pair (1.6 GB, cached after the first run): its greedy ids are checked
# against the numpy reference (crates/llada-cli/tests/qwen.rs), which must not skip here.
cargo run --release --quiet -p llada-cli -- fetch qwen2.5-coder-0.5b
cargo run --release --quiet -p llada-cli -- fetch qwen2.5-coder-1.5b
export LLADA_REQUIRE_REAL_MODELS=1

if [ "${1:-}" = "--ci" ] || [ -n "${LLADA_LINT:-}" ]; then
  cargo fmt --all -- --check
  cargo clippy --release --workspace --all-targets -- -D warnings
fi
cargo test --release --workspace
# The library's first screen of docs, run: every mode through the facade.
cargo run --release --quiet -p llada --example embed
# `llada serve` as OpenAI's own client sees it (outputs equal to `llada generate`'s).
python3 tests/serve/openai_client.py "${CARGO_TARGET_DIR:-target}/release/llada"
# The playground page (GET /) in headless Chromium: a diffusion answer drawn from all-masked to
# the text `llada generate` gives, a chat, a stop, speculative counts, no console errors.
# Debian's chromium and its chromedriver (selenium's own driver download is not used).
if ! { command -v chromium && command -v chromedriver; } >/dev/null; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium chromium-driver
fi
python3 tests/serve/browser_test.py "${CARGO_TARGET_DIR:-target}/release/llada"
# --- aarch64 (NEON) kernels under qemu-user ------------------------------------------------------
# llada-kernels cross-compiled for 64-bit ARM, its tests run under `qemu-aarch64 -cpu max`
# (.cargo/config.toml: linker and runner; `-cpu max` has dotprod, so both NEON paths are checked).
if [ "$(uname -m)" != aarch64 ] &&
  ! { command -v qemu-aarch64 && command -v aarch64-linux-gnu-gcc; } >/dev/null; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu ||
  rustup target add aarch64-unknown-linux-gnu
if [ "${1:-}" = "--ci" ] || [ -n "${LLADA_LINT:-}" ]; then
  cargo clippy --release -p llada-kernels --all-targets --target aarch64-unknown-linux-gnu \
    -- -D warnings
fi
cargo test --release -p llada-kernels --target aarch64-unknown-linux-gnu
# --- end aarch64 ----------------------------------------------------------------------------------
if [ "${1:-}" = "--ci" ]; then
  scripts/newcomer.sh
fi
