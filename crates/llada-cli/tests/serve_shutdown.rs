//! `llada serve` stops gracefully: on SIGTERM it refuses new connections, finishes the stream
//! in flight (finish chunk and `[DONE]`), then exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn sigterm_finishes_the_streams_in_flight_then_exits() {
    let home = std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    if !home
        .join(".cache/llada/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        .exists()
    {
        assert!(std::env::var_os("LLADA_REQUIRE_REAL_MODELS").is_none());
        eprintln!("skipped: smollm2 not fetched");
        return;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut server = Command::new(env!("CARGO_BIN_EXE_llada"))
        .args(["serve", "--port", &port.to_string(), "--threads", "2"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    let connect = || loop {
        if let Ok(s) = TcpStream::connect(&addr) {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let s = connect();
    let body =
        r#"{"prompt": "Once upon a time", "max_tokens": 96, "temperature": 0, "stream": true}"#;
    write!(
        &s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    // Wait for the first token, then ask the server to stop.
    while !line.starts_with("data: {") {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    let mut rest = String::new();
    r.read_to_string(&mut rest).unwrap();
    let finish = rest
        .lines()
        .filter(|l| l.contains("\"finish_reason\":\"length\""))
        .count();
    assert_eq!(finish, 1, "the stream was cut: {rest}");
    // (The body is chunked: chunk sizes sit between the events.)
    let done = rest.find("data: [DONE]").expect("no [DONE]");
    assert!(
        done > rest.find("\"finish_reason\":\"length\"").unwrap(),
        "{rest}"
    );
    let status = server.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        TcpStream::connect(&addr).is_err(),
        "still accepting after exit"
    );
}
