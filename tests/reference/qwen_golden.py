#!/usr/bin/env python3
"""Golden greedy ids of the Qwen2.5-Coder 0.5B / 1.5B Q4_K_M files for
crates/llada-cli/tests/qwen.rs: four prompts (two raw, two in the model's ChatML template with
its default system prompt), 16 steps each, through gguf_ref.py (float64 on exactly dequantized
weights). The prompt ids are the ones `llada generate --json` reports (Qwen2's BPE; the test
checks the engine still encodes them so).

usage: python3 qwen_golden.py OUT.json [CACHE_DIR]   (~5 min for 0.5B, ~25 min for 1.5B; 8 GB RAM)
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525,
          264, 10950, 17847, 13, 151645, 198, 151644, 872, 198]
TAIL = [151645, 198, 151644, 77091, 198]
CASES = [
    ("def fibonacci(n):", True, [750, 75698, 1445, 1648]),
    ("The capital of France is", True, [785, 6722, 315, 9625, 374]),
    ("Write a haiku about code.", False, SYSTEM + [7985, 264, 6386, 38242, 911, 2038, 13] + TAIL),
    ("Complete this function: def is_prime(n):", False,
     SYSTEM + [12548, 419, 729, 25, 707, 374, 38217, 1445, 1648] + TAIL),
]
MODELS = {
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}


def main(argv):
    out = argv[1]
    cache = argv[2] if len(argv) > 2 else os.path.expanduser("~/.cache/llada")
    golden = {"generator": "tests/reference/qwen_golden.py (gguf_ref.py, float64)"}
    for alias, rel in MODELS.items():
        golden[alias] = []
        for prompt, raw, ids in CASES:
            tmp = out + ".case.json"
            subprocess.run([sys.executable, os.path.join(HERE, "gguf_ref.py"), os.path.join(cache, rel),
                            "--steps", "16", "--prompt", ",".join(map(str, ids)), "--json", tmp],
                           check=True)
            with open(tmp) as f:
                r = json.load(f)
            os.remove(tmp)
            golden[alias].append({"prompt": prompt, "raw": raw, "prompt_ids": ids,
                                  "ids": r["ids"], "margins": r["margins"]})
    with open(out, "w") as f:
        json.dump(golden, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
