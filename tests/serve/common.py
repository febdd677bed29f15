"""What the `llada serve` tests share: the binary under test, `llada generate` as the reference
output, and a server on a free port that is always stopped."""
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLADA = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/llada")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate(*args):
    """`llada generate ARGS`'s stdout, less the final newline."""
    out = subprocess.run([LLADA, "generate", *args], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.endswith("\n"), out.stdout
    return out.stdout[:-1]


def start_server(*args, what="serve test"):
    """`llada serve ARGS` on a free port, once it answers /health: (process, base URL)."""
    port = free_port()
    server = subprocess.Popen(
        [LLADA, "serve", "--port", str(port), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        if server.poll() is not None:
            sys.exit(f"{what}: the server exited: " + server.stderr.read())
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            return server, base
        except OSError:
            time.sleep(0.1)
    stop_server(server)
    sys.exit(f"{what}: the server did not answer /health within 30 s")


def stop_server(server):
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
