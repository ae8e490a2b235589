//! `mdsd serve` against hostile and careless clients, all on 127.0.0.1 and bounded in time:
//! stalled uploads and stalled `GET`s with announced bodies, clients that stop reading, clients
//! that hang up mid-stream, a thousand short-lived connections, malformed and oversized
//! requests, idle connections and a connection cap. Meanwhile `/health` and completions are
//! answered, and after each the server's threads and open files are back where they were.
//! Also: prefix reuse stays within a tenant, and SIGTERM stops the server gracefully.

use super::{http, post, s, start, Server};
use crate::common::{temp_dir, Tiny};
use candle_core::quantized::GgmlDType;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

/// The server's thread and open-file counts.
fn resources(server: &Server) -> (usize, usize) {
    let pid = server.child.id();
    let count = |what: &str| std::fs::read_dir(format!("/proc/{pid}/{what}")).map_or(0, |d| d.count());
    (count("task"), count("fd"))
}

/// Waits (up to `secs`) until the server holds no more threads and files than `base`.
fn back_to(server: &Server, base: (usize, usize), secs: u64, after: &str) {
    let start = Instant::now();
    loop {
        let now = resources(server);
        if now.0 <= base.0 && now.1 <= base.1 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "after {after}: {now:?} threads and open files, {base:?} before"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A connection to the server on `port` from address `from` (127.0.0.X), with a receive
/// buffer of `rcvbuf` bytes when given (a client that reads slowly, with little buffered).
fn connect(port: u16, from: [u8; 4], rcvbuf: Option<i32>) -> TcpStream {
    // SAFETY: plain socket calls on a descriptor this function owns until it hands it over.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        if let Some(n) = rcvbuf {
            let p = &n as *const i32 as *const libc::c_void;
            assert_eq!(libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, 4), 0);
        }
        let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip) },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = addr(from, 0);
        assert_eq!(libc::bind(fd, &local as *const _ as *const libc::sockaddr, len), 0, "bind {from:?}");
        let remote = addr([127, 0, 0, 1], port);
        let rc = libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len);
        assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

/// `(status, seconds)` of a `GET /health`.
fn timed_health(port: u16) -> (u16, f64) {
    let t = Instant::now();
    let (status, _) = http(port, "GET", "/health", "");
    (status, t.elapsed().as_secs_f64())
}

/// Waits (up to `secs`) until `/health` reports no running answer.
fn idle(port: u16, secs: u64, after: &str) {
    let start = Instant::now();
    loop {
        let (_, text) = http(port, "GET", "/health", "");
        let v: Value = serde_json::from_str(&text).unwrap();
        if v["running"] == 0 && v["waiting"] == 0 {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "after {after}, still answering: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes a completion request with `body` on `c` (the connection kept open).
fn write_completion(c: &mut TcpStream, body: &str) {
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
}

/// Reads `c`'s streamed answer up to its first event; the reader, for the rest.
fn first_event(c: TcpStream) -> BufReader<TcpStream> {
    let mut reader = BufReader::new(c);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended before its first event");
    }
    reader
}

/// A raw request's first response line, read within 10 s ("" when the server closed first).
fn status_line(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    line.trim_end().to_string()
}

const COMPLETION: &str = r#"{"prompt": "AB", "max_tokens": 4, "ignore_eos": true}"#;

/// Stalled uploads and `GET`s, slow readers, hang-ups, a thousand short connections and bad
/// requests, one after the other against one server (see the module docs).
#[test]
fn serve_survives_stalled_and_hostile_clients() {
    let dir = temp_dir("serve-hostile");
    let target = Tiny { context: 8192, ..Tiny::llama(71) }.write_hf(&dir.join("target"));
    let server = start(&[
        "--target",
        s(&target),
        "--no-spec",
        "--temperature",
        "0",
        "--max-batch",
        "3",
        "--header-timeout",
        "4",
        "--body-timeout",
        "4",
        "--write-timeout",
        "1",
        "--context",
        "8192",
    ]);
    let port = server.port;
    assert_eq!(post(port, "/v1/completions", &serde_json::from_str(COMPLETION).unwrap()).0, 200);
    std::thread::sleep(Duration::from_millis(300));
    let base = resources(&server);

    // 1. 100 uploads that announce a body and send part of it, 100 GETs that announce one and
    //    send none: /health and a completion are answered meanwhile.
    let mut stalled = Vec::new();
    for _ in 0..100 {
        let mut c = connect(port, [127, 0, 0, 1], None);
        write!(c, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"pro").unwrap();
        stalled.push(c);
    }
    let mut gets = Vec::new();
    for _ in 0..100 {
        let mut c = connect(port, [127, 0, 0, 1], None);
        write!(c, "GET /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n").unwrap();
        gets.push(c);
    }
    let (status, secs) = timed_health(port);
    eprintln!("/health with 200 stalled clients: {:.1} ms", secs * 1e3);
    assert_eq!(status, 200);
    assert!(secs < 1.0, "/health took {secs} s with 200 stalled clients");
    let t = Instant::now();
    let (status, v) = post(port, "/v1/completions", &serde_json::from_str(COMPLETION).unwrap());
    assert_eq!(status, 200, "{v}");
    assert!(t.elapsed() < Duration::from_secs(3), "a completion took {:?} beside stalled clients", t.elapsed());
    // The GETs are answered without their bodies; the uploads get 408 at the body deadline.
    assert!(status_line(&mut gets[0]).starts_with("HTTP/1.1 200"));
    let line = status_line(&mut stalled[0]);
    assert!(line.starts_with("HTTP/1.1 408"), "a stalled upload got {line:?}");
    drop((stalled, gets));
    back_to(&server, base, 20, "200 stalled clients");

    // 2. Two clients that stop reading their streams: their answers end at the write deadline
    //    (their sockets still open), while another client is answered.
    // Events of 2-3 KB (20 log-probabilities each): more than the socket buffers and the
    // answer's channel hold.
    let body =
        json!({"prompt": "AB", "max_tokens": 7000, "ignore_eos": true, "stream": true, "logprobs": 20}).to_string();
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut c = connect(port, [127, 0, 0, 1], Some(4096));
        write_completion(&mut c, &body);
        slow.push(c);
    }
    let t = Instant::now();
    let (status, v) = post(port, "/v1/completions", &serde_json::from_str(COMPLETION).unwrap());
    assert_eq!(status, 200, "{v}");
    assert!(t.elapsed() < Duration::from_secs(5), "a completion beside slow readers took {:?}", t.elapsed());
    idle(port, 30, "two clients stopped reading");
    let m = super::metrics(port);
    assert_eq!(m["answers_ended_total{reason=\"client\"}"], 2.0, "{m:?}");
    drop(slow);
    back_to(&server, base, 20, "slow readers");

    // 3. Eight clients hang up after their stream's first event.
    for _ in 0..8 {
        let mut c = connect(port, [127, 0, 0, 1], None);
        write_completion(&mut c, &body);
        drop(first_event(c)); // hang up
    }
    // Their answers end (before the next three, which must all get slots of their own).
    idle(port, 30, "eight clients hung up mid-stream");
    let m = super::metrics(port);
    assert_eq!(m["answers_ended_total{reason=\"client\"}"], 10.0, "{m:?}");
    // And three that hang up while waiting for a whole (not streamed) answer.
    let whole = json!({"prompt": "AB", "max_tokens": 8000, "ignore_eos": true}).to_string();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let mut c = connect(port, [127, 0, 0, 1], None);
        write_completion(&mut c, &whole);
        waiting.push(c);
    }
    let t = Instant::now();
    while serde_json::from_str::<Value>(&http(port, "GET", "/health", "").1).unwrap()["running"] != 3 {
        assert!(t.elapsed() < Duration::from_secs(10), "the three whole answers did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(waiting);
    idle(port, 30, "eleven clients hung up");
    let m = super::metrics(port);
    assert_eq!(m["answers_ended_total{reason=\"client\"}"], 13.0, "{m:?}");
    back_to(&server, base, 20, "hang-ups");

    // 4. A thousand short-lived connections: half ask for /health, half hang up at once.
    let t = Instant::now();
    for i in 0..1000 {
        if i % 2 == 0 {
            assert_eq!(http(port, "GET", "/health", "").0, 200);
        } else {
            drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
        }
    }
    eprintln!("1000 short connections: {:.2} s", t.elapsed().as_secs_f64());
    back_to(&server, base, 20, "1000 short connections");

    // 5. Sixty-four /tokenize requests at once run on a bounded pool of threads.
    let peak = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(resources(&server).0, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let clients: Vec<_> = (0..64)
            .map(|_| scope.spawn(|| post(port, "/tokenize", &json!({"prompt": "ABCD".repeat(500)})).0))
            .collect();
        for c in clients {
            assert_eq!(c.join().unwrap(), 200);
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    // The runtime's blocking threads: --max-batch + 16 at most.
    let peak = peak.into_inner();
    assert!(peak <= base.0 + 3 + 16, "{peak} threads while tokenizing, {} before", base.0);
    back_to(&server, base, 20, "64 tokenize requests");

    // 6. Malformed and oversized requests (a chunked body over the 32 MiB limit among them).
    let cases: [(&str, Vec<u8>); 7] = [
        ("400", "GARBAGE\r\n\r\n".as_bytes().to_vec()),
        ("431", format!("GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20)).into_bytes()),
        ("413", "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n".as_bytes().to_vec()),
        ("413", format!("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2200000\r\n{}\r\n", "a".repeat(33 << 20)).into_bytes()),
        ("415", format!("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{COMPLETION}", COMPLETION.len()).into_bytes()),
        ("403", "GET /health HTTP/1.1\r\nHost: attacker.example\r\n\r\n".as_bytes().to_vec()),
        ("400", b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 3\r\n\r\n\xff\xfe{".to_vec()),
    ];
    for (want, request) in &cases {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // The server may answer and close before reading everything.
        let _ = c.write_all(request);
        let line = status_line(&mut c);
        let head = String::from_utf8_lossy(&request[..request.len().min(60)]);
        if *want == "400" && line.is_empty() {
            // A request line hyper cannot parse may be dropped without an answer.
            continue;
        }
        assert!(line.starts_with(&format!("HTTP/1.1 {want}")), "{head:?}: {line:?}, expected {want}");
    }
    assert_eq!(post(port, "/v1/completions", &serde_json::from_str(COMPLETION).unwrap()).0, 200);
    back_to(&server, base, 20, "malformed requests");
}

/// A connection that sends nothing is closed at the header deadline; with `--max-connections`
/// open, one more is closed at once, and served again once one closes.
#[test]
fn serve_caps_and_times_out_connections() {
    let dir = temp_dir("serve-cap");
    let target = Tiny::llama(72).write_hf(&dir.join("target"));
    let server = start(&["--target", s(&target), "--no-spec", "--max-connections", "4", "--header-timeout", "1"]);
    let port = server.port;
    let mut idle_conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    idle_conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    let n = idle_conn.read(&mut buf).unwrap_or(0);
    let waited = t.elapsed();
    assert!(n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"), "{:?}", &buf[..n]);
    assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(5), "closed after {waited:?}");

    let open: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut over = TcpStream::connect(("127.0.0.1", port)).unwrap();
    over.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = over.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let got = over.read(&mut buf).unwrap_or(0);
    assert_eq!(got, 0, "a connection over the cap was served: {:?}", String::from_utf8_lossy(&buf[..got]));
    drop(open);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(http(port, "GET", "/health", "").0, 200);
}

/// Clients that hang up while their requests wait for a slot leave the queue: `/health` says
/// nothing waits once the slot's own answer ended (their count stayed, for good, when the
/// dropped requests never gave it back).
#[test]
fn serve_forgets_waiting_requests_whose_clients_hung_up() {
    let dir = temp_dir("serve-waiting-hangup");
    let target = Tiny { context: 8192, ..Tiny::llama(77) }.write_hf(&dir.join("target"));
    let server = start(&["--target", s(&target), "--no-spec", "--max-batch", "1", "--context", "8192"]);
    let port = server.port;
    let health = || serde_json::from_str::<Value>(&http(port, "GET", "/health", "").1).unwrap();
    // The only slot answers a long streamed request, read to its first event.
    let long = json!({"prompt": "AB", "max_tokens": 6000, "ignore_eos": true, "stream": true}).to_string();
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write_completion(&mut c, &long);
    let running = first_event(c);
    // Three more wait for it, then hang up.
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write_completion(&mut c, COMPLETION);
        waiting.push(c);
    }
    let t = Instant::now();
    while health()["waiting"] != 3 {
        assert!(t.elapsed() < Duration::from_secs(10), "the three did not queue: {}", health());
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in &waiting {
        c.shutdown(std::net::Shutdown::Both).unwrap();
    }
    drop(waiting);
    // The long answer ends when its client goes too.
    drop(running);
    idle(port, 30, "three waiting clients and the running one hung up");
    // And the queue takes new requests as before.
    let (status, v) = post(port, "/v1/completions", &serde_json::from_str(COMPLETION).unwrap());
    assert_eq!(status, 200, "{v}");
}

/// A completion from the client address `from` (a loopback address of its own: a tenant of its
/// own when no API key is set); its answer, asserted 200.
fn completion_from(port: u16, from: [u8; 4], body: &Value) -> Value {
    let body = body.to_string();
    let mut c = connect(port, from, None);
    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap()
}

/// Prefix reuse stays within a tenant: a second client (another address) sending the first's
/// prompt reuses nothing, the first client reuses its own prompt, `--shared-prefix-cache`
/// lets everyone reuse, and `reused_tokens` leaves the answers without
/// `--show-reused-tokens`.
#[test]
fn serve_keeps_prefix_caches_per_tenant() {
    let dir = temp_dir("serve-tenant");
    let target = Tiny::llama(73).write_hf(&dir.join("target"));
    let prompt = "ABABABAB ABABAB";
    let request = |port: u16, from: [u8; 4]| completion_from(port, from, &json!({"prompt": prompt, "max_tokens": 2}));
    let reused = |v: &Value| v["mdsd"]["reused_tokens"].as_u64().unwrap_or_else(|| panic!("no reused_tokens: {v}"));
    let (a, b) = ([127, 0, 0, 1], [127, 0, 0, 2]);
    {
        let server = start(&["--target", s(&target), "--no-spec", "--max-batch", "1", "--show-reused-tokens"]);
        assert_eq!(reused(&request(server.port, a)), 0);
        assert_eq!(reused(&request(server.port, b)), 0, "another client reused the first's prompt");
        assert!(reused(&request(server.port, b)) > 0, "a client does not reuse its own prompt");
        assert_eq!(reused(&request(server.port, a)), 0, "the slot went to client b meanwhile");
    }
    {
        let server = start(&[
            "--target",
            s(&target),
            "--no-spec",
            "--max-batch",
            "1",
            "--show-reused-tokens",
            "--shared-prefix-cache",
        ]);
        assert_eq!(reused(&request(server.port, a)), 0);
        assert!(reused(&request(server.port, b)) > 0, "--shared-prefix-cache shares nothing");
    }
    {
        let server = start(&["--target", s(&target), "--no-spec"]);
        let v = request(server.port, a);
        assert!(v["mdsd"].is_object() && v["mdsd"].get("reused_tokens").is_none(), "{v}");
    }
}

/// `--tree auto` times the models once for every slot: a second client, answered by another
/// slot, measures nothing (each slot timed them again on its first request, seconds of forwards
/// that the running streams waited for).
#[test]
fn serve_slots_share_auto_costs() {
    let dir = temp_dir("serve-auto-slots");
    let target = Tiny::llama(75).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(76) }.write_hf(&dir.join("draft"));
    let server =
        start(&["--target", s(&target), "--draft", s(&draft), "--tree", "auto", "--max-batch", "2", "--no-warmup"]);
    let request = |from: [u8; 4], prompt: &str| {
        completion_from(
            server.port,
            from,
            &json!({"prompt": prompt, "max_tokens": 4, "ignore_eos": true, "temperature": 0}),
        )
    };
    let costs = |v: &Value| v["mdsd"]["auto_costs_s"].as_f64().unwrap_or_else(|| panic!("no auto_costs_s: {v}"));
    let first = request([127, 0, 0, 1], "ABCD");
    assert!(costs(&first) > 0.0, "the first request measures: {first}");
    // Another tenant: the least used free slot, not the first one.
    let second = request([127, 0, 0, 2], "DCBA");
    assert_eq!(costs(&second), 0.0, "the second slot measured again: {second}");
}

/// The warm-up before the server listens measures `auto`'s forward costs for both candidate
/// sets (temperature 0 and above), so the first requests at either temperature measure
/// nothing; the log says so.
#[test]
fn serve_warms_up_before_it_listens() {
    let dir = temp_dir("serve-warm-up");
    let target = Tiny::llama(77).write_gguf(&dir.join("target.gguf"), GgmlDType::Q8_0, &[]);
    let draft = Tiny { layers: 1, ..Tiny::llama(78) }.write_hf(&dir.join("draft"));
    let server = start(&["--target", s(&target), "--draft", s(&draft), "--tree", "auto"]);
    assert!(server.log().contains("warmed up in"), "{}", server.log());
    for temperature in [0.0, 0.7] {
        let v = completion_from(
            server.port,
            [127, 0, 0, 1],
            &json!({"prompt": "ABCD", "max_tokens": 4, "ignore_eos": true, "temperature": temperature}),
        );
        let costs = v["mdsd"]["auto_costs_s"].as_f64().unwrap_or_else(|| panic!("no auto_costs_s: {v}"));
        assert_eq!(costs, 0.0, "temperature {temperature}: the first request measured: {v}");
    }
}

/// SIGTERM: the server stops accepting and lets a running answer end within the grace period
/// (or ends it after), says which, and exits 0.
#[test]
fn serve_stops_gracefully_on_sigterm() {
    let dir = temp_dir("serve-stop");
    let target = Tiny { context: 8192, ..Tiny::llama(74) }.write_hf(&dir.join("target"));
    for (grace, tokens, said) in [("30", 200, "every running answer ended"), ("1", 8000, "ended")] {
        let mut server = start(&["--target", s(&target), "--no-spec", "--shutdown-grace", grace, "--context", "8192"]);
        let port = server.port;
        let body = json!({"prompt": "AB", "max_tokens": tokens, "ignore_eos": true, "stream": true}).to_string();
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write_completion(&mut c, &body);
        let mut reader = first_event(c);
        // SAFETY: signalling a child process this test started.
        assert_eq!(unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) }, 0);
        let reading = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            rest
        });
        let status = server.child.wait().unwrap();
        assert!(status.success(), "grace {grace}: {status:?}");
        let rest = reading.join().unwrap();
        if grace == "30" {
            assert!(
                rest.contains("[DONE]"),
                "the answer was not finished: {}",
                &rest[rest.len().saturating_sub(200)..]
            );
        }
        let log = server.log();
        assert!(log.contains("stopping") && log.contains(said), "grace {grace}: {log}");
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "still accepting after stopping");
    }
}
