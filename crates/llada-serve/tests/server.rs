//! `llada serve` end to end over real sockets, on SmolLM2: a table of hostile requests (each
//! gets its 4xx and an OpenAI error object, and the server keeps serving), the API key, a
//! full queue (503 + Retry-After), a client that disconnects mid-stream (its sequence leaves
//! and its slot frees), and continuous batching's exactness (concurrent greedy requests get
//! what each gets alone).

use llada::EngineOptions;
use llada_serve::{ModelSpec, ServeConfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const KEY: &str = "test-key";

/// SmolLM2's cached file, or `None` (the test is skipped unless real models are required).
fn smollm2() -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let p = home.join(".cache/llada/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("LLADA_REQUIRE_REAL_MODELS").is_none(),
        "{} missing: run `llada fetch smollm2`",
        p.display()
    );
    eprintln!("skipped: {} not fetched", p.display());
    None
}

/// A server on a free port (its own thread and runtime, for the test process's life).
fn start(model: &std::path::Path, parallel: usize, queue: usize, key: Option<&str>) -> SocketAddr {
    let cfg = ServeConfig {
        models: vec![(
            "smollm2".into(),
            ModelSpec {
                source: model.display().to_string(),
                engine: EngineOptions {
                    threads: Some(2),
                    quiet: true,
                    ..Default::default()
                },
                draft: None,
                parallel,
                queue,
            },
        )],
        api_key: key.map(str::to_string),
        default_max_tokens: 16,
        body_limit: 64 << 10,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        llada_serve::serve_blocking(cfg, "127.0.0.1:0".parse().unwrap(), |a| tx.send(a).unwrap())
            .unwrap()
    });
    rx.recv_timeout(Duration::from_secs(30)).unwrap()
}

/// One raw HTTP/1.1 exchange: (status, headers, body).
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(request).unwrap();
    let mut buf = vec![];
    s.read_to_end(&mut buf).unwrap();
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(buf.len());
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf.get(split + 4..).unwrap_or_default().to_vec();
    (status, head, body)
}

fn request(method: &str, path: &str, key: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(k) = key {
        r.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    r.push_str("\r\n");
    let mut v = r.into_bytes();
    v.extend_from_slice(body);
    v
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (st, _, b) = raw(
        addr,
        &request("POST", path, Some(KEY), body.to_string().as_bytes()),
    );
    (st, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

/// The hostile cases: (what, method, path, body, expected status).
fn cases() -> Vec<(&'static str, &'static str, &'static str, Vec<u8>, u16)> {
    let c = "/v1/completions";
    let ch = "/v1/chat/completions";
    let j = |v: Value| v.to_string().into_bytes();
    let long_prompt = "hello ".repeat(9000);
    vec![
        ("unknown route", "GET", "/v1/nope", vec![], 404),
        ("wrong method", "GET", c, vec![], 405),
        ("empty body", "POST", c, vec![], 400),
        ("not JSON", "POST", c, b"prompt=hi".to_vec(), 400),
        ("JSON array", "POST", c, b"[1, 2]".to_vec(), 400),
        (
            "truncated JSON",
            "POST",
            c,
            b"{\"prompt\": \"hi".to_vec(),
            400,
        ),
        (
            "deeply nested JSON",
            "POST",
            c,
            "[".repeat(5000).into_bytes(),
            400,
        ),
        (
            "invalid UTF-8",
            "POST",
            c,
            b"{\"prompt\": \"\xff\xfe\"}".to_vec(),
            400,
        ),
        ("missing prompt", "POST", c, j(json!({})), 400),
        (
            "prompt of wrong type",
            "POST",
            c,
            j(json!({"prompt": 5})),
            400,
        ),
        (
            "two prompts",
            "POST",
            c,
            j(json!({"prompt": ["a", "b"]})),
            400,
        ),
        (
            "echo",
            "POST",
            c,
            j(json!({"prompt": "a", "echo": true})),
            400,
        ),
        (
            "max_tokens 0",
            "POST",
            c,
            j(json!({"prompt": "a", "max_tokens": 0})),
            400,
        ),
        (
            "max_tokens negative",
            "POST",
            c,
            j(json!({"prompt": "a", "max_tokens": -5})),
            400,
        ),
        (
            "max_tokens absurd",
            "POST",
            c,
            j(json!({"prompt": "a", "max_tokens": 1_000_000_000_000u64})),
            400,
        ),
        (
            "max_tokens a string",
            "POST",
            c,
            j(json!({"prompt": "a", "max_tokens": "ten"})),
            400,
        ),
        (
            "max_tokens fractional",
            "POST",
            c,
            j(json!({"prompt": "a", "max_tokens": 2.5})),
            400,
        ),
        (
            "temperature negative",
            "POST",
            c,
            j(json!({"prompt": "a", "temperature": -1})),
            400,
        ),
        (
            "temperature too high",
            "POST",
            c,
            j(json!({"prompt": "a", "temperature": 5})),
            400,
        ),
        (
            "temperature a string",
            "POST",
            c,
            j(json!({"prompt": "a", "temperature": "hot"})),
            400,
        ),
        (
            "top_p above 1",
            "POST",
            c,
            j(json!({"prompt": "a", "top_p": 1.5})),
            400,
        ),
        (
            "top_k negative",
            "POST",
            c,
            j(json!({"prompt": "a", "top_k": -1})),
            400,
        ),
        (
            "seed negative",
            "POST",
            c,
            j(json!({"prompt": "a", "seed": -1})),
            400,
        ),
        ("n = 3", "POST", c, j(json!({"prompt": "a", "n": 3})), 400),
        (
            "frequency_penalty",
            "POST",
            c,
            j(json!({"prompt": "a", "frequency_penalty": 1.0})),
            400,
        ),
        (
            "five stop strings",
            "POST",
            c,
            j(json!({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})),
            400,
        ),
        (
            "empty stop string",
            "POST",
            c,
            j(json!({"prompt": "a", "stop": [""]})),
            400,
        ),
        (
            "stream not a bool",
            "POST",
            c,
            j(json!({"prompt": "a", "stream": "yes"})),
            400,
        ),
        (
            "unknown stream option",
            "POST",
            c,
            j(json!({"prompt": "a", "stream": true, "stream_options": {"bogus": 1}})),
            400,
        ),
        (
            "unknown model",
            "POST",
            c,
            j(json!({"prompt": "a", "model": "gpt-4"})),
            404,
        ),
        (
            "a path as the model",
            "POST",
            c,
            j(json!({"prompt": "a", "model": "/etc/passwd"})),
            404,
        ),
        (
            "prompt past the context",
            "POST",
            c,
            j(json!({"prompt": long_prompt})),
            400,
        ),
        (
            "body over the limit",
            "POST",
            c,
            j(json!({"prompt": "x".repeat(100_000)})),
            413,
        ),
        (
            "bad diffusion strategy",
            "POST",
            c,
            j(json!({"prompt": "a", "strategy": "magic"})),
            400,
        ),
        ("chat without messages", "POST", ch, j(json!({})), 400),
        (
            "chat with no message",
            "POST",
            ch,
            j(json!({"messages": []})),
            400,
        ),
        (
            "messages not a list",
            "POST",
            ch,
            j(json!({"messages": "hi"})),
            400,
        ),
        (
            "unknown role",
            "POST",
            ch,
            j(json!({"messages": [{"role": "wizard", "content": "hi"}]})),
            400,
        ),
        (
            "image content part",
            "POST",
            ch,
            j(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            ),
            400,
        ),
        (
            "content of wrong type",
            "POST",
            ch,
            j(json!({"messages": [{"role": "user", "content": 7}]})),
            400,
        ),
    ]
}

#[test]
fn hostile_requests_get_their_4xx_and_the_server_keeps_serving() {
    let Some(m) = smollm2() else { return };
    let addr = start(&m, 4, 8, Some(KEY));
    let cases = cases();
    assert!(cases.len() >= 30);
    for (what, method, path, body, want) in &cases {
        let (st, head, b) = raw(addr, &request(method, path, Some(KEY), body));
        assert_eq!(st, *want, "{what}: {head}\n{}", String::from_utf8_lossy(&b));
        if st != 405 {
            let v: Value = serde_json::from_slice(&b)
                .unwrap_or_else(|_| panic!("{what}: not JSON: {}", String::from_utf8_lossy(&b)));
            let msg = v["error"]["message"].as_str().unwrap_or("");
            assert!(!msg.is_empty(), "{what}: no error message in {v}");
        }
        // The next request is served.
        let (st, v) = post(
            addr,
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 2}),
        );
        assert_eq!(st, 200, "after {what}: {v}");
    }
    // Garbage that is not HTTP, and a body shorter than its Content-Length.
    let (st, _, _) = raw(addr, b"HELLO\r\n\r\n");
    assert_eq!(st, 400);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pr")
        .unwrap();
    drop(s);
    // Diffusion-only rules (answer length a multiple of the block) do not apply here.
    let (st, v) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 37}),
    );
    assert_eq!(st, 200, "{v}");
}

#[test]
fn the_api_key_guards_every_route_but_health() {
    let Some(m) = smollm2() else { return };
    let addr = start(&m, 1, 1, Some(KEY));
    for (path, method) in [
        ("/v1/models", "GET"),
        ("/metrics", "GET"),
        ("/v1/completions", "POST"),
        ("/v1/chat/completions", "POST"),
    ] {
        for key in [None, Some("wrong")] {
            let (st, head, b) = raw(addr, &request(method, path, key, b"{}"));
            assert_eq!(st, 401, "{path} with {key:?}: {head}");
            assert!(head
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer"));
            let v: Value = serde_json::from_slice(&b).unwrap();
            assert_eq!(v["error"]["type"], "authentication_error");
        }
    }
    assert_eq!(raw(addr, &request("GET", "/health", None, b"")).0, 200);
    assert_eq!(
        raw(addr, &request("GET", "/v1/models", Some(KEY), b"")).0,
        200
    );
}

/// Read an SSE response until `n` data events arrived; returns the stream (still open).
fn open_stream(addr: SocketAddr, body: &Value, n: usize) -> (BufReader<TcpStream>, Vec<String>) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    (&s).write_all(&request(
        "POST",
        "/v1/completions",
        Some(KEY),
        body.to_string().as_bytes(),
    ))
    .unwrap();
    let mut r = BufReader::new(s);
    let mut events = vec![];
    let mut line = String::new();
    while events.len() < n {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            events.push(d.to_string());
        }
    }
    (r, events)
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, _, b) = raw(addr, &request("GET", "/metrics", Some(KEY), b""));
    String::from_utf8_lossy(&b)
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{name} "))
                .map(|v| v.parse().unwrap())
        })
        .unwrap_or(f64::NAN)
}

#[test]
fn a_full_queue_answers_503_and_a_disconnected_client_frees_its_slot() {
    let Some(m) = smollm2() else { return };
    // One slot, no queue.
    let addr = start(&m, 1, 0, Some(KEY));
    let long = json!({"prompt": "Count: 1, 2, 3,", "max_tokens": 100_000, "stream": true, "temperature": 0});
    let (stream, events) = open_stream(addr, &long, 2);
    assert_eq!(events.len(), 2, "the stream started");
    let (st, head, _) = raw(
        addr,
        &request(
            "POST",
            "/v1/completions",
            Some(KEY),
            br#"{"prompt": "a", "max_tokens": 2}"#,
        ),
    );
    assert_eq!(st, 503, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    // The client goes away: its sequence leaves within a pass or two and the slot frees.
    drop(stream);
    let t0 = Instant::now();
    while metric(addr, "llada_requests_cancelled_total") < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the cancelled stream was not removed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("cancelled after {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    let (st, v) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2}),
    );
    assert_eq!(st, 200, "{v}");
    // The gauge is the worker's report after each pass.
    let t0 = Instant::now();
    while metric(addr, "llada_active_sequences") != 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a sequence stayed active"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn concurrent_greedy_requests_get_what_each_gets_alone() {
    let Some(m) = smollm2() else { return };
    let addr = start(&m, 8, 8, Some(KEY));
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a land far away,",
        "The three primary colours are",
        "A haiku about the sea:",
    ];
    let body = |p: &str| json!({"prompt": p, "max_tokens": 24, "temperature": 0});
    let alone: Vec<Value> = prompts
        .iter()
        .map(|p| post(addr, "/v1/completions", &body(p)).1)
        .collect();
    let together: Vec<Value> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || post(addr, "/v1/completions", &body(p)).1))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (a, t) in alone.iter().zip(&together) {
        assert_eq!(a["choices"][0]["text"], t["choices"][0]["text"]);
        assert_eq!(
            a["usage"]["completion_tokens"],
            t["usage"]["completion_tokens"]
        );
    }
    // They shared passes: fewer passes than one per token of every request.
    let rows = metric(addr, "llada_pass_rows_sum");
    let passes = metric(addr, "llada_pass_rows_count");
    eprintln!("{rows} rows in {passes} passes");
    assert!(
        rows / passes > 1.2,
        "{rows} rows in {passes} passes: no batching"
    );
}
