#!/usr/bin/env python3
"""The synthetic tasks and the character vocabulary of the task models, in plain Python.

A second implementation of `crates/llada-train/src/tasks.rs` and `vocab.rs` for
`scripts/train_tasks_torch.py` (the task models' accelerator path). The Rust generator is the
reference: `python3 scripts/task_data.py --check FILE` checks this file's answers and held-out
hash on `prompt<TAB>answer<TAB>held` lines the Rust generator wrote (the test
`python_task_generator_agrees` in llada-train runs it), so the two cannot drift apart silently.
"""

import math
import sys

# ---------------------------------------------------------------- vocabulary (vocab.rs)
EOS, BOS, MASK = 0, 1, 2
SPECIALS = ["<|endoftext|>", "<|startoftext|>", "<|mask|>"]
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz+=,;:?>| "
VOCAB = len(SPECIALS) + len(CHARS)


def decode(ids):
    out = []
    for i in ids:
        if i == EOS:
            break
        if i >= len(SPECIALS):
            out.append(CHARS[i - len(SPECIALS)])
    return "".join(out)


def tokenizer_json():
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({c: i + len(SPECIALS) for i, c in enumerate(CHARS)})
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(SPECIALS)
    ]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": None, "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<|endoftext|>"},
    }


# ---------------------------------------------------------------- tasks (tasks.rs)
TASKS = ["add", "sort", "rev", "cumsum", "multi"]
ADD_WIDTH, CUM_WIDTH, SORT_MAX, REV_MAX = 10, 16, 32, 16
MULTI_SUBTASKS = ["add", "rev", "cumsum"]
MULTI_QUESTIONS = 5
MULTI_SLOT = 4 + 2 * ADD_WIDTH + 1


def is_held_out(prompt):
    """FNV-1a of the prompt's bytes, bucket 0 of 16 (tasks.rs `is_held_out`)."""
    h = 0xCBF29CE484222325
    for b in prompt.encode("ascii"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % 16 == 0


def _digits(rng, n):
    s = [str(rng.randrange(10)) for _ in range(n)]
    if n > 1 and s[0] == "0":
        s[0] = str(rng.randrange(1, 10))
    return "".join(s)


def solve(task, q):
    """The answer to question `q` (prompt without its `=`) of `task`: the checker."""
    if task == "add":
        a, b = q[len("add:"):].split("+")
        return str(int(a) + int(b)).zfill(ADD_WIDTH + 1)
    if task == "sort":
        return " ".join(sorted(q[len("sort:"):].split(" ")))
    if task == "rev":
        return q[len("rev:"):][::-1]
    if task == "cumsum":
        acc, out = 0, []
        for c in q[len("cum:"):]:
            acc = (acc + int(c)) % 10
            out.append(str(acc))
        return "".join(out)
    raise ValueError(task)


def _length(rng, most, scale, lo):
    """A length in [lo·most·scale, most·scale] (at least 1), as tasks.rs draws them."""
    hi = max(1, math.ceil(most * scale))
    low = min(max(1, math.ceil(most * scale * lo)), hi)
    return rng.randint(low, hi)


def one(rng, task, scale=1.0, lo=0.0):
    """One question of `task` and its answer; `scale` and `lo` narrow the length range (the
    Rust trainer's length bands)."""
    n = lambda most: _length(rng, most, scale, lo)  # noqa: E731
    if task == "add":
        a, b = _digits(rng, n(ADD_WIDTH)), _digits(rng, n(ADD_WIDTH))
        q = f"add:{a.zfill(ADD_WIDTH)}+{b.zfill(ADD_WIDTH)}"
    elif task == "sort":
        q = "sort:" + " ".join(str(rng.randrange(10)) for _ in range(n(SORT_MAX)))
    elif task == "rev":
        q = "rev:" + "".join(chr(97 + rng.randrange(26)) for _ in range(n(REV_MAX)))
    else:
        q = "cum:" + _digits(rng, n(CUM_WIDTH)).zfill(CUM_WIDTH)
    return q, solve(task, q)


def example(rng, task, held_out=False, scale=1.0, lo=0.0, subtasks=None, short_rev=None):
    """(prompt, answer) of `task`, drawn until it falls on the requested side of the split.
    `subtasks` ({sub-task: weight}) weights the items of a multi-question prompt for training
    (`--multi-mix`); None draws them uniformly, as the held-out split and tasks.rs do.
    `short_rev` (P, MOST), for training only (`--multi-short-rev`): a multi-question prompt's
    reversal item draws its word from 1 to MOST letters with probability P, else from the
    full range."""
    names, weights = zip(*subtasks.items()) if subtasks else (None, None)
    while True:
        if task == "multi":
            ps, ans = [], []
            for i in range(1, MULTI_QUESTIONS + 1):
                sub = (rng.choices(names, weights)[0] if subtasks
                       else rng.choice(MULTI_SUBTASKS))
                if sub == "rev" and short_rev and rng.random() < short_rev[0]:
                    p, a = one(rng, sub, short_rev[1] / REV_MAX, 0.0)
                else:
                    p, a = one(rng, sub, scale, lo)
                ps.append(f"{i}>{p:>{MULTI_SLOT}}")
                ans.append(f"{i}>{a:<{MULTI_SLOT}}")
            prompt, answer = ";".join(ps) + "=", ";".join(ans)
        else:
            q, answer = one(rng, task, scale, lo)
            prompt = q + "="
        if is_held_out(prompt) == held_out:
            return prompt, answer


def solve_prompt(prompt):
    """Task and answer of a whole prompt (multi-question prompts included)."""
    q = prompt[:-1]
    if q.startswith("1>"):
        items = q.split(";")
        ans = []
        for i, it in enumerate(items, 1):
            body = it.split(">", 1)[1].lstrip(" ")
            task = {"add": "add", "rev": "rev", "cum": "cumsum"}[body.split(":")[0]]
            ans.append(f"{i}>{solve(task, body):<{MULTI_SLOT}}")
        return "multi", ";".join(ans)
    task = {"add": "add", "sort": "sort", "rev": "rev", "cum": "cumsum"}[q.split(":")[0]]
    return task, solve(task, q)


def check_prompts(path):
    bad = n = 0
    for line in open(path):
        prompt, answer, held = line.rstrip("\n").split("\t")
        n += 1
        task, mine = solve_prompt(prompt)
        if mine != answer or is_held_out(prompt) != (held == "1"):
            bad += 1
            print(f"mismatch ({task}): {prompt!r} → {mine!r}, Rust {answer!r}", file=sys.stderr)
    print(f"{n - bad}/{n} prompts agree with the Rust generator")
    return bad == 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--check":
        sys.exit("usage: task_data.py --check FILE")
    sys.exit(0 if check_prompts(sys.argv[2]) else 1)
