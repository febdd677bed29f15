#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server: N concurrent streaming clients for a while.

Starts `llada serve` (and, with --peer, llama.cpp's `llama-server` on the same GGUF with the
same number of parallel slots and threads), runs each client count of --clients against each
server in turn, and reports per run: requests done and failed, completion tokens/s over all
clients, time to first token and inter-token latency (p50/p99), and the server's RSS after
warm-up (first/last/max sample). Standard library only (threads + http.client).

  scripts/load/serve_load.py --model ~/.cache/llada/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
      --clients 1,8,32 --duration 60 --peer --json load.json
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.expanduser("~/.cache/llada/peer/llama.cpp-0.3.36/bin/llama-server")
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "List five facts about the Moon.",
    "Describe a walk through a forest in autumn.",
    "What makes bread rise? Explain simply.",
    "Write a poem about the sea at night.",
    "Give advice to someone learning to cook.",
    "Explain what a computer's memory does.",
    "Tell me about the history of tea.",
    "Describe the life cycle of a butterfly.",
    "Why is the sky blue?",
    "Write a letter to a friend about a trip to the mountains.",
    "Explain photosynthesis to a child.",
    "What are the rules of chess, briefly?",
    "Describe a busy market in the morning.",
    "How do bees make honey?",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Client(threading.Thread):
    """Sends streaming chat requests back to back until `stop`; records per request the
    time to first token, the gaps between tokens and the tokens received."""

    def __init__(self, i, port, args, stop):
        super().__init__(daemon=True)
        self.i, self.port, self.args, self.stop = i, port, args, stop
        self.ttft, self.itl, self.done, self.failed, self.errors = [], [], 0, 0, []

    def run(self):
        n = self.i
        while not self.stop.is_set():
            try:
                self.one(PROMPTS[n % len(PROMPTS)])
                self.done += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                if not self.stop.is_set():
                    self.failed += 1
                    self.errors.append(repr(e)[:200])
                    time.sleep(0.5)
            n += 1

    def one(self, prompt):
        body = {"model": self.args.served_name, "stream": True, "temperature": 0.8,
                "max_tokens": self.args.max_tokens, "seed": self.i,
                "messages": [{"role": "user", "content": prompt}]}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        last = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(str(ev["error"])[:200])
            ch = ev.get("choices") or []
            if ch and (ch[0].get("delta") or {}).get("content"):
                now = time.perf_counter()
                if last is None:
                    self.ttft.append(now - t0)
                else:
                    self.itl.append(now - last)
                last = now
        c.close()


def wait_ready(port, proc, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not become ready")


def start_server(kind, args, port, slots):
    if kind == "llada":
        cmd = [args.llada, "serve", "-m", f"{args.served_name}={args.model}", "--port", str(port),
               "--parallel", str(slots), "--queue", str(4 * slots), "--threads", str(args.threads),
               "--max-tokens", str(args.max_tokens)]
    else:
        cmd = [PEER, "-m", args.model, "--port", str(port), "-np", str(slots), "-t",
               str(args.threads), "-c", str(slots * args.ctx_per_slot), "--alias", args.served_name,
               "--no-webui"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, p)
    # Load the model (ours loads on first request) before anything is timed.
    body = json.dumps({"model": args.served_name, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body,
        {"Content-Type": "application/json"}), timeout=600).read()
    return p


def run_load(kind, args, clients):
    port = free_port()
    proc = start_server(kind, args, port, max(clients, args.slots or clients))
    stop = threading.Event()
    cs = [Client(i, port, args, stop) for i in range(clients)]
    try:
        for c in cs:
            c.start()
        time.sleep(args.warmup)
        for c in cs:  # measure from here: drop the warm-up's records
            c.ttft, c.itl, c.done, c.failed = [], [], 0, 0
        rss, t0 = [], time.time()
        while time.time() - t0 < args.duration:
            time.sleep(min(5, args.duration))
            rss.append(rss_kb(proc.pid))
        elapsed = time.time() - t0
        # Tokens received during the window: every recorded first token and gap.
        received = sum(len(c.ttft) + len(c.itl) for c in cs)
        stop.set()
        for c in cs:
            c.join(timeout=60)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    ttft = [x for c in cs for x in c.ttft]
    itl = [x for c in cs for x in c.itl]
    rss = [r for r in rss if r]
    return {
        "server": kind, "clients": clients, "seconds": round(elapsed, 1),
        "requests": sum(c.done for c in cs), "failed": sum(c.failed for c in cs),
        "errors": [e for c in cs for e in c.errors][:5],
        "tokens": received, "tokens_per_s": round(received / elapsed, 1),
        "ttft_p50_ms": ms(pct(ttft, 50)), "ttft_p99_ms": ms(pct(ttft, 99)),
        "itl_p50_ms": ms(pct(itl, 50)), "itl_p99_ms": ms(pct(itl, 99)),
        "rss_mb_first": mb(rss[0] if rss else None), "rss_mb_last": mb(rss[-1] if rss else None),
        "rss_mb_max": mb(max(rss) if rss else None),
        "rss_drift": round(max(rss) / rss[0] - 1, 4) if rss else None,
    }


def ms(x):
    return None if x is None else round(x * 1e3, 1)


def mb(kb):
    return None if kb is None else round(kb / 1024, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file both servers load")
    ap.add_argument("--served-name", default="model")
    ap.add_argument("--clients", default="1,8,32", help="client counts, comma-separated")
    ap.add_argument("--duration", type=float, default=60, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=10, help="unmeasured seconds first")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=0,
                    help="parallel slots (default: the client count of each run)")
    ap.add_argument("--ctx-per-slot", type=int, default=512, help="llama-server: -c = slots × this")
    ap.add_argument("--peer", action="store_true", help="also run llama-server")
    ap.add_argument("--llada", default=os.path.join(ROOT, "target/release/llada"))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    kinds = ["llada"] + (["llama-server"] if args.peer else [])
    if args.peer and not os.path.exists(PEER):
        sys.exit(f"{PEER} missing: build it with scripts/peer/llama_cpp.sh")
    rows = []
    for n in [int(x) for x in args.clients.split(",")]:
        for k in kinds:
            r = run_load(k, args, n)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"\n{'server':13} {'clients':>7} {'req':>5} {'fail':>4} {'tok/s':>7} "
          f"{'TTFT p50/p99 ms':>17} {'ITL p50/p99 ms':>15} {'RSS MB first/max':>17}")
    for r in rows:
        print(f"{r['server']:13} {r['clients']:>7} {r['requests']:>5} {r['failed']:>4} "
              f"{r['tokens_per_s']:>7} {str(r['ttft_p50_ms'])+'/'+str(r['ttft_p99_ms']):>17} "
              f"{str(r['itl_p50_ms'])+'/'+str(r['itl_p99_ms']):>15} "
              f"{str(r['rss_mb_first'])+'/'+str(r['rss_mb_max']):>17}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "max_tokens": args.max_tokens,
                       "threads": args.threads, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
