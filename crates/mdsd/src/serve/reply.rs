//! How an answer leaves its generation thread for its connection: the head (a whole answer, or
//! the start of a stream) through a one-shot channel to the request's handler, and a streamed
//! answer's events through a bounded channel that never blocks the generation. A client that
//! stops reading (the channel full) or goes away (the channel closed) ends its own answer; every
//! other generation goes on.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};
use std::io::Write;
use tokio::sync::{mpsc, oneshot};

/// Events a streamed answer may have in flight before the client is judged too slow (its
/// generation ends: at some tokens per event, minutes of text a reader never took).
pub(super) const STREAM_EVENTS_IN_FLIGHT: usize = 1024;

/// What the generation thread hands to the handler first.
pub(super) enum Head {
    /// The whole response.
    Whole(Response),
    /// A stream of server-sent events follows through the body channel.
    Stream,
}

/// The generation thread's end of an answer.
pub(super) struct Reply {
    head: oneshot::Sender<Head>,
    body: mpsc::Sender<Bytes>,
}

/// The handler's end of an answer.
pub(super) struct Pending {
    pub(super) head: oneshot::Receiver<Head>,
    pub(super) body: mpsc::Receiver<Bytes>,
}

/// A connected pair of ends.
pub(super) fn channel() -> (Reply, Pending) {
    let (head_tx, head_rx) = oneshot::channel();
    let (body_tx, body_rx) = mpsc::channel(STREAM_EVENTS_IN_FLIGHT);
    (Reply { head: head_tx, body: body_tx }, Pending { head: head_rx, body: body_rx })
}

impl Reply {
    /// Answers with a whole response (a handler gone meanwhile is not an error here).
    pub(super) fn whole(self, response: Response) {
        let _ = self.head.send(Head::Whole(response));
    }

    pub(super) fn error(self, status: u16, msg: &str) {
        self.whole(error_response(status, msg))
    }

    /// Starts a stream of server-sent events: its writer.
    pub(super) fn stream(self) -> EventSink {
        let _ = self.head.send(Head::Stream);
        EventSink { tx: self.body }
    }
}

/// The end of an answer, sent once its generator is back in the pool: a client that sends its
/// next turn as soon as it has this finds free the slot that holds its text.
pub(super) enum Last {
    /// A whole response, through its reply.
    Whole(Reply, Response),
    /// A stream's `data: [DONE]`, then its end.
    Stream(EventSink),
}

impl Last {
    pub(super) fn send(self) {
        match self {
            Last::Whole(reply, response) => reply.whole(response),
            // A client gone meanwhile has nothing left to miss.
            Last::Stream(mut sink) => {
                let _ = sink.write_all(b"data: [DONE]\n\n");
            }
        }
    }
}

/// The writer of a streamed answer's body. A write fails when the client stopped reading (more
/// than [`STREAM_EVENTS_IN_FLIGHT`] events unsent) or went away; it never waits.
pub(super) struct EventSink {
    tx: mpsc::Sender<Bytes>,
}

impl Write for EventSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.tx.try_send(Bytes::copy_from_slice(buf)) {
            Ok(()) => Ok(buf.len()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                Err(std::io::Error::new(std::io::ErrorKind::WouldBlock, "the client stopped reading"))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A JSON response with `status`.
pub(super) fn json_response(status: u16, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// OpenAI's error object with `status`.
pub(super) fn error_response(status: u16, msg: &str) -> Response {
    let kind = if status < 500 { "invalid_request_error" } else { "server_error" };
    json_response(status, &json!({"error": {"message": msg, "type": kind, "code": status}}))
}

/// 503 with OpenAI's error object and `Retry-After: 1`.
pub(super) fn busy_response(msg: &str) -> Response {
    let mut r = error_response(503, msg);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// The response of a streamed answer: server-sent events from the body channel.
pub(super) fn event_stream(body: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures_util::stream::unfold(body, |mut rx| async move {
        rx.recv().await.map(|chunk| (Ok::<Bytes, std::io::Error>(chunk), rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
