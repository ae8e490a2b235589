//! A connection's write deadline ([`WriteDeadline`]): a client that stops reading (its receive
//! window full, so writes to it stay pending) loses its connection after the deadline, and the
//! connection's task, socket and answer end with it, instead of waiting for the client forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep, Instant, Sleep};

/// `io` whose writes fail with [`io::ErrorKind::TimedOut`] once one has waited `limit` without
/// progress. Reads pass through untouched.
pub(super) struct WriteDeadline<T> {
    io: T,
    limit: Duration,
    /// Armed while a write waits: when it fires.
    timer: Pin<Box<Sleep>>,
    armed: bool,
}

impl<T> WriteDeadline<T> {
    pub(super) fn new(io: T, limit: Duration) -> Self {
        Self { io, limit, timer: Box::pin(sleep(limit)), armed: false }
    }

    /// What a write that made no progress (`Pending`) returns: `Pending` until the deadline,
    /// then the timeout error.
    fn waited(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.armed {
            self.timer.as_mut().reset(Instant::now() + self.limit);
            self.armed = true;
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", self.limit.as_secs_f64()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Maps a write's poll: progress disarms the timer, a wait arms it.
    fn track<R>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match polled {
            Poll::Pending => match self.waited(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            ready => {
                self.armed = false;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.track(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.track(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.track(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.track(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A writer that never takes a byte times out after the limit; one that takes them does not.
    #[tokio::test(start_paused = true)]
    async fn stalled_writes_time_out() {
        let (client, _server) = tokio::io::duplex(8);
        let mut w = WriteDeadline::new(client, Duration::from_secs(2));
        // 8 bytes fit the pipe; the rest waits for a reader that never comes.
        let started = Instant::now();
        let err = w.write_all(&[0u8; 64]).await.expect_err("a stalled write must time out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_secs(2));

        let (client, mut server) = tokio::io::duplex(8);
        let mut w = WriteDeadline::new(client, Duration::from_secs(2));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut server, &mut got).await.map(|_| got.len())
        });
        w.write_all(&[1u8; 64]).await.expect("a read pipe takes every byte");
        w.shutdown().await.expect("shutdown");
        drop(w);
        assert_eq!(reader.await.expect("reader").expect("read"), 64);
    }
}
