#!/usr/bin/env python3
"""`llada serve` through the official `openai` Python client (PyPI), on SmolLM2 and the shipped
diffusion model tiny-llada-tasks: chat and completions, whole and streamed, errors raised as the
client's exception types, and greedy outputs identical to `llada generate`'s.

Usage: tests/serve/openai_client.py [PATH_TO_LLADA_BINARY]   (default: target/release/llada)
"""
import openai

from common import generate, start_server, stop_server  # tests/serve/

KEY = "sk-test"


def main():
    server, base = start_server("-m", "smollm2", "-m", "tiny-llada-tasks", "--api-key", KEY,
                                what="openai client test")
    try:
        run(openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0), base)
    finally:
        stop_server(server)
    print("openai client: all checks passed")


def run(client, base):
    ids = sorted(m.id for m in client.models.list().data)
    assert ids == ["smollm2", "tiny-llada-tasks"], ids

    # Chat, greedy: the same text as `llada generate` (chat template), whole and streamed.
    q = "Name a sea."
    want = generate(q, "-t", "0", "-n", "24")
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=24)
    got = r.choices[0].message.content
    assert got == want, (got, want)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    pieces, finish, usage = [], None, None
    for chunk in client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": q}], temperature=0,
            max_tokens=24, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(pieces) == want, ("".join(pieces), want)
    assert len(pieces) > 2, "streamed in pieces"
    assert finish == r.choices[0].finish_reason
    assert usage.completion_tokens == r.usage.completion_tokens

    # Completions, greedy, raw prompt.
    p = "The capital of France is"
    want = generate(p, "--raw", "-t", "0", "-n", "16")
    r = client.completions.create(model="smollm2", prompt=p, temperature=0, max_tokens=16)
    assert r.choices[0].text == want, (r.choices[0].text, want)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2", prompt=p, temperature=0, max_tokens=16, stream=True) if c.choices)
    assert streamed == want, (streamed, want)
    # A stop string cuts the text before it.
    r = client.completions.create(model="smollm2", prompt=p, temperature=0, max_tokens=16,
                                  stop=["."])
    assert r.choices[0].text == want.split(".")[0] and r.choices[0].finish_reason == "stop"
    # Sampling with a seed is reproducible.
    a, b = (client.completions.create(model="smollm2", prompt=p, temperature=0.9, seed=7,
                                      max_tokens=12).choices[0].text for _ in range(2))
    assert a == b, (a, b)

    # The diffusion model: the same answer as `llada generate --mode diffusion`.
    p = "sort: 5 3 9 1 ="
    want = generate("-m", "tiny-llada-tasks", "--mode", "diffusion", p, "--raw",
                    "--gen-length", "16", "--block-length", "16")
    r = client.completions.create(model="tiny-llada-tasks", prompt=p, max_tokens=16,
                                  extra_body={"block_length": 16})
    assert r.choices[0].text == want, (r.choices[0].text, want)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-llada-tasks", prompt=p, max_tokens=16, stream=True,
        extra_body={"block_length": 16}) if c.choices)
    assert streamed == want, (streamed, want)

    # Errors as the client's exception types.
    expect(openai.BadRequestError, lambda: client.completions.create(
        model="smollm2", prompt=p, max_tokens=0))
    expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model="smollm2", messages=[{"role": "wizard", "content": "hi"}]))
    expect(openai.BadRequestError, lambda: client.completions.create(
        model="smollm2", prompt="hello " * 9000, max_tokens=4))
    expect(openai.NotFoundError, lambda: client.completions.create(model="gpt-4", prompt=p))
    bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: bad.models.list())


def expect(kind, call):
    try:
        call()
    except kind as e:
        assert e.message, e
        return
    raise AssertionError(f"expected {kind.__name__}")


if __name__ == "__main__":
    main()
