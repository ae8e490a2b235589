//! The HTTP layer, on tokio with hyper and axum: a cap on connections (more are closed at
//! once), a deadline for a request's headers (which also closes idle keep-alive connections)
//! and one for its body, bodies read and checked before a request is admitted, and the routes.
//! Every connection is a task of its own: a client that sends nothing, announces a body and
//! never sends it, or stops reading holds up nobody else.
//!
//! Checks before routing: the `Host` must be an address, `localhost` or one of `--allowed-host`
//! (a web page's DNS rebinding cannot reach the server), a POST must say `Content-Type:
//! application/json` (a web page cannot send that to another origin without asking first),
//! bodies above [`MAX_BODY_BYTES`] are refused from their announced length, and with an API key
//! every route but `/health` and `/metrics` needs it (compared in constant time).

use super::deadline::WriteDeadline;
use super::pool::Refused;
use super::reply::{self, busy_response, error_response, event_stream, json_response, Head};
use super::request::{self, Kind, Refusal, MAX_BODY_BYTES};
use super::{answer::Answering, tokens, App, Cancel};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The HTTP limits (`mdsd serve`'s flags).
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Connections open at once; more are closed as they arrive.
    pub(super) max_connections: usize,
    /// From a connection's start (or its last answer) to the end of a request's headers.
    pub(super) header_timeout: Duration,
    /// From the headers to the end of the body.
    pub(super) body_timeout: Duration,
    /// How long a write to a client may wait for it to read ([`WriteDeadline`]).
    pub(super) write_timeout: Duration,
    /// After a stop signal, how long running answers may take before they are ended.
    pub(super) shutdown_grace: Duration,
}

/// The client's address, as the connection saw it.
#[derive(Clone, Copy)]
pub(super) struct Peer(pub(super) SocketAddr);

/// The routes.
pub(super) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(|s, p, h, b| completion(s, p, h, b, Kind::Text)))
        .route("/v1/chat/completions", post(|s, p, h, b| completion(s, p, h, b, Kind::Chat)))
        .route("/tokenize", post(|s, h, b| tokenize(s, h, b, true)))
        .route("/detokenize", post(|s, h, b| tokenize(s, h, b, false)))
        .fallback(|req: Request| async move { error_response(404, &format!("no endpoint {}", req.uri().path())) })
        .method_not_allowed_fallback(|req: Request| async move {
            error_response(405, &format!("{} is not allowed on {}", req.method(), req.uri().path()))
        })
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
}

/// Serves `listener` until a stop signal (SIGTERM, SIGINT), then stops accepting, lets the
/// running answers end within the grace period, ends the others, and returns.
pub(super) async fn serve(app: Arc<App>, listener: TcpListener) {
    let limits = app.limits;
    let router = router(Arc::clone(&app));
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let stop = stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    // Over the cap: closed at once (the client sees a reset, not a wait).
                    drop(stream);
                    continue;
                };
                let router = router.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(Peer(peer));
                        let router = router.clone();
                        async move { tower::ServiceExt::oneshot(router, req.map(Body::new)).await }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_timeout)
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(WriteDeadline::new(stream, limits.write_timeout)), service);
                    let _ = connection.await;
                    drop(permit);
                });
            }
        }
    }
    app.stopping.store(true, Ordering::SeqCst);
    let (running, _) = app.pool.counts();
    eprintln!(
        "mdsd serve: stopping: no new connections; {running} answers running get {} s to end",
        limits.shutdown_grace.as_secs_f64()
    );
    let deadline = tokio::time::Instant::now() + limits.shutdown_grace;
    while app.pool.counts().0 > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (left, _) = app.pool.counts();
    if left > 0 {
        app.cancel_all.store(true, Ordering::SeqCst);
        eprintln!("mdsd serve: {left} answers still running at the end of the grace period: ended");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while app.pool.counts().0 > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        eprintln!("mdsd serve: every running answer ended");
    }
}

/// Resolves at SIGTERM or SIGINT (Ctrl-C).
async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Whether `host` (a `Host` header's name, without the port) may reach this server.
fn host_allowed(app: &App, host: &str) -> bool {
    let name = host.trim_start_matches('[').trim_end_matches(']');
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || app.allowed_hosts.iter().any(|h| h == "*" || h.eq_ignore_ascii_case(name))
}

/// The name of a `Host` header value (without its port).
fn host_name(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    value.rsplit_once(':').map_or(value, |(h, port)| if port.chars().all(|c| c.is_ascii_digit()) { h } else { value })
}

/// `a == b` in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The checks before routing (see the module docs).
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(host_name);
    if let Some(host) = host.filter(|h| !host_allowed(&app, h)) {
        return error_response(403, &format!("Host `{host}` is not this server's (--allowed-host)"));
    }
    if let Some(n) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok()) {
        if n > MAX_BODY_BYTES as u64 {
            return error_response(413, &format!("the body has {n} bytes; the limit is {MAX_BODY_BYTES}"));
        }
    }
    if !app.api_keys.is_empty() {
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        let open = path == "/health" || path == "/metrics";
        // Every key is compared (in constant time), so the time says nothing of which matched.
        let valid =
            given.is_some_and(|g| app.api_keys.iter().fold(false, |ok, key| same_secret(g, key.as_bytes()) | ok));
        if !open && !valid {
            if path.ends_with("completions") {
                app.load.count(super::metrics::Outcome::Unauthorized);
            }
            return error_response(401, "a valid API key is needed (Authorization: Bearer KEY)");
        }
    }
    if req.method() == Method::POST {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")));
        if !json {
            return error_response(415, "POST bodies must be JSON (Content-Type: application/json)");
        }
    }
    next.run(req).await
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let (running, waiting) = app.pool.counts();
    let status = if app.stopping.load(Ordering::SeqCst) { "stopping" } else { "ok" };
    json_response(200, &json!({"status": status, "running": running, "waiting": waiting}))
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let (running, waiting) = app.pool.counts();
    let mut r = app.load.prometheus(running, waiting, app.batcher.stats()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

async fn models(State(app): State<Arc<App>>) -> Response {
    json_response(200, &json!({"object": "list", "data": [{"id": app.model, "object": "model", "owned_by": "mdsd"}]}))
}

/// A request's body within the body deadline and [`MAX_BODY_BYTES`], or the response that
/// refuses it.
async fn read_body(app: &App, body: Body) -> Result<String, Response> {
    let limited = axum::body::to_bytes(body, MAX_BODY_BYTES);
    let bytes: Bytes = match tokio::time::timeout(app.limits.body_timeout, limited).await {
        Err(_) => {
            return Err(error_response(
                408,
                &format!("the body did not arrive within {} s", app.limits.body_timeout.as_secs_f64()),
            ))
        }
        Ok(Err(e)) => {
            return Err(error_response(413, &format!("reading the body: {e} (the limit is {MAX_BODY_BYTES} bytes)")))
        }
        Ok(Ok(b)) => b,
    };
    String::from_utf8(bytes.to_vec()).map_err(|_| error_response(400, "the body is not UTF-8"))
}

/// Who a request's cached prefix belongs to: its API key, else its client's address, or everyone
/// with `--shared-prefix-cache`.
fn tenant(app: &App, headers: &HeaderMap, peer: Peer) -> String {
    if app.shared_prefix_cache {
        return "shared".into();
    }
    match headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        // The guard let the request in: its key is one of the server's.
        Some(key) if !app.api_keys.is_empty() => format!("key {key}"),
        _ => format!("client {}", peer.0.ip()),
    }
}

/// Sets a request's cancel flag when dropped armed: the handler's future was dropped (its
/// client went away) before the answer's head came back.
struct CancelOnDrop(Option<Arc<AtomicBool>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

/// `/v1/completions` and `/v1/chat/completions`: the body read and checked, a slot waited for,
/// the answer generated on a thread of its own, batched with the others'.
async fn completion(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<Peer>,
    headers: HeaderMap,
    body: Body,
    kind: Kind,
) -> Response {
    use super::metrics::Outcome;
    let path = if kind == Kind::Chat { "/v1/chat/completions" } else { "/v1/completions" };
    if app.stopping.load(Ordering::SeqCst) {
        return busy_response("the server is stopping");
    }
    let body = match read_body(&app, body).await {
        Ok(b) => b,
        Err(r) => {
            app.load.count(Outcome::Refused);
            return r;
        }
    };
    let checking = Arc::clone(&app);
    let checked = tokio::task::spawn_blocking(move || request::check(kind, &body, &checking.defaults())).await;
    let (req, prompts, config) = match checked {
        Ok(Ok(c)) => c,
        Ok(Err(Refusal(status, msg))) => {
            eprintln!("mdsd serve: POST {path}: {status} {msg}");
            app.load.count(Outcome::Refused);
            return error_response(status, &msg);
        }
        Err(_) => return error_response(500, "checking the request failed; see the server's log"),
    };
    let tenant = tenant(&app, &headers, peer);
    let lease = match app.pool.acquire(&tenant, &prompts[0].ids).await {
        Ok(l) => l,
        Err(Refused::QueueFull(waiting)) => {
            app.load.count(Outcome::Busy);
            let msg = format!("the queue is full: {waiting} waiting (the server's --max-waiting); retry later");
            eprintln!("mdsd serve: POST {path}: 503 {msg}");
            return busy_response(&msg);
        }
    };
    app.load.count(Outcome::Generated);
    let (reply, pending) = reply::channel();
    let own = Arc::new(AtomicBool::new(false));
    let mut armed = CancelOnDrop(Some(Arc::clone(&own)));
    let number = app.served.fetch_add(1, Ordering::SeqCst) + 1;
    let answering = Arc::clone(&app);
    tokio::task::spawn_blocking(move || {
        let mut lease = lease;
        let _member = answering.batcher.join();
        let cancel = Cancel { own, server: Arc::clone(&answering.cancel_all) };
        let mut a = Answering { app: &answering, generator: lease.generator(), number, cancel: &cancel };
        let last = a.generate(reply, kind, &req, &prompts, &config, path);
        // The slot goes back before the client can see its answer end: a next turn sent at
        // once finds free the slot that holds its text (its prefix reused).
        if let Some(pause) = slot_return_pause() {
            std::thread::sleep(pause);
        }
        drop(lease);
        if let Some(last) = last {
            last.send();
        }
    });
    match pending.head.await {
        Ok(Head::Whole(r)) => {
            armed.0 = None;
            r
        }
        Ok(Head::Stream) => {
            // From here a client that goes away closes the body channel, which ends the answer.
            armed.0 = None;
            event_stream(pending.body)
        }
        Err(_) => error_response(500, "the answer's thread ended without an answer; see the server's log"),
    }
}

/// `MDSD_TEST_SLOT_RETURN_PAUSE_MS`: a pause before an answer's slot goes back to the pool, so
/// that a test can check that the answer's end never leaves before it (a next turn sent at once
/// would otherwise miss its cached text). Unset outside tests.
fn slot_return_pause() -> Option<Duration> {
    static PAUSE: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *PAUSE.get_or_init(|| {
        std::env::var("MDSD_TEST_SLOT_RETURN_PAUSE_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis)
    })
}

/// `/tokenize` and `/detokenize`: on a blocking thread, at most a few at once.
async fn tokenize(State(app): State<Arc<App>>, _headers: HeaderMap, body: Body, encode: bool) -> Response {
    let path = if encode { "/tokenize" } else { "/detokenize" };
    let body = match read_body(&app, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Ok(_permit) = app.tokenize_slots.acquire().await else {
        return error_response(503, "the server is stopping");
    };
    let working = Arc::clone(&app);
    let answer = tokio::task::spawn_blocking(move || {
        let tok = &working.session.target.tokenizer;
        if encode {
            tokens::tokenize(tok, working.defaults().capacity, &body)
        } else {
            tokens::detokenize(tok, &body)
        }
    })
    .await;
    match answer {
        Ok(Ok(value)) => json_response(200, &value),
        Ok(Err(Refusal(status, msg))) => {
            eprintln!("mdsd serve: POST {path}: {status} {msg}");
            error_response(status, &msg)
        }
        Err(_) => error_response(500, "tokenizing failed; see the server's log"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_secrets() {
        assert_eq!(host_name("127.0.0.1:8080"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("example.com:80"), "example.com");
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd") && !same_secret(b"abc", b"ab"));
    }
}
