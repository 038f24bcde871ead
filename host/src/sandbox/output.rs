//! A guest's stdout and stderr, captured line by line into `tracing`.
//!
//! Guests may print for debugging; the host must not let that become a log flood or a memory sink.
//! Lines are cut at [`MAX_LINE`] bytes and pass through a token bucket ([`BURST`] lines, refilled
//! at [`LINES_PER_SEC`]); what the bucket refuses is counted and reported once it refills.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// Longest line logged; the rest of a longer line is dropped.
pub const MAX_LINE: usize = 1024;
/// Lines a guest may log in a burst.
pub const BURST: f64 = 200.0;
/// Sustained lines per second a guest may log.
pub const LINES_PER_SEC: f64 = 20.0;
/// Lines of stderr kept to explain a failure (a Rust panic message precedes its trap).
const TAIL_LINES: usize = 4;

/// Which stream a line came from.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A guest output stream for `WasiCtxBuilder::stdout`/`stderr`.
#[derive(Clone)]
pub struct GuestOutput {
    inner: Arc<Mutex<LineState>>,
}

struct LineState {
    tail: VecDeque<String>,
    scanner: Arc<str>,
    stream: Stream,
    line: Vec<u8>,
    truncated: bool,
    tokens: f64,
    refilled: Instant,
    suppressed: u64,
}

impl GuestOutput {
    /// Output of the guest named `scanner`.
    pub fn new(scanner: Arc<str>, stream: Stream) -> Self {
        GuestOutput {
            inner: Arc::new(Mutex::new(LineState {
                tail: VecDeque::new(),
                scanner,
                stream,
                line: Vec::new(),
                truncated: false,
                tokens: BURST,
                refilled: Instant::now(),
                suppressed: 0,
            })),
        }
    }

    /// The last few non-empty lines written, oldest first, joined by " | ".
    pub fn tail(&self) -> Option<String> {
        let state = self.inner.lock().ok()?;
        (!state.tail.is_empty()).then(|| Vec::from(state.tail.clone()).join(" | "))
    }

    fn write(&self, bytes: &[u8]) {
        let Ok(mut state) = self.inner.lock() else {
            return;
        };
        for chunk in bytes.split_inclusive(|&b| b == b'\n') {
            let (body, ends_line) = match chunk.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (chunk, false),
            };
            let room = MAX_LINE.saturating_sub(state.line.len());
            state.line.extend_from_slice(&body[..body.len().min(room)]);
            state.truncated |= body.len() > room;
            if ends_line {
                state.emit();
            }
        }
    }
}

impl LineState {
    fn emit(&mut self) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * LINES_PER_SEC).min(BURST);
        self.refilled = now;
        let line = String::from_utf8_lossy(&self.line).trim_end().to_string();
        let truncated = std::mem::take(&mut self.truncated);
        self.line.clear();
        if line.is_empty() {
            return;
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.chars().take(200).collect());
        if self.tokens < 1.0 {
            self.suppressed += 1;
            return;
        }
        self.tokens -= 1.0;
        let scanner = &*self.scanner;
        if self.suppressed > 0 {
            tracing::warn!(
                target: "wdp::guest",
                scanner,
                suppressed = self.suppressed,
                "guest output over the rate limit was dropped"
            );
            self.suppressed = 0;
        }
        let stream = match self.stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        };
        if truncated {
            tracing::info!(target: "wdp::guest", scanner, stream, "{line} [line cut at {MAX_LINE} bytes]");
        } else {
            tracing::info!(target: "wdp::guest", scanner, stream, "{line}");
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_caps_and_limits() {
        let out = GuestOutput::new("t".into(), Stream::Stdout);
        out.write(b"hello ");
        out.write(b"world\nsecond");
        {
            let s = out.inner.lock().unwrap();
            assert_eq!(s.line, b"second");
            assert!((BURST - 1.0..BURST - 0.9).contains(&s.tokens));
        }
        out.write(&vec![b'x'; 5000]);
        out.write(b"\n");
        {
            let s = out.inner.lock().unwrap();
            assert!(s.line.is_empty());
            assert!((BURST - 2.0..BURST - 1.9).contains(&s.tokens));
        }
        for _ in 0..10_000 {
            out.write(b"spam\n");
        }
        let s = out.inner.lock().unwrap();
        assert!(
            s.suppressed > 9_000,
            "a flood is mostly suppressed: {}",
            s.suppressed
        );
    }
}
