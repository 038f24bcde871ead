//! The `:authority` of HTTP/2 requests on kubelet's Unix sockets, as kubelet's gRPC client sends
//! it and as wdp's HTTP/2 server accepts it.
//!
//! kubelet dials with grpc-go. For a target with no scheme (kubelet's plugin watcher dials every
//! `*-reg.sock` so, in every release; its DRA manager dials `dra.sock` so up to 1.33), grpc-go's
//! `passthrough` resolver makes the socket path the authority and percent-encodes it
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F<driver>-reg.sock`); for a `unix:` target
//! (`dra.sock` from 1.34) it sends `localhost`, and with `WithAuthority("localhost")` (the
//! device-plugin client) too. Other gRPC clients send the bare path (grpc-java), or the path with
//! its first `/` dropped (gRPC C-core: Python). The HTTP/2 server under tonic (the `h2` crate)
//! parses `:authority` with the `http` crate, which refuses `%` in a host and `/` anywhere, and
//! resets such a request with PROTOCOL_ERROR: kubelet's `GetInfo` fails and the driver is never
//! registered. No release of h2 or http accepts them and neither has an option to (a pull
//! request to h2 for Unix sockets has stayed open for years), and a patched fork of h2 would be
//! ours to keep in step with every release.
//!
//! So [`Rewrite::inbound`] sits between the accepted socket and the server and rewrites, in
//! every request's header block, an authority `http` refuses to `localhost`, which is what the
//! authority of a Unix socket means (gRPC has no use for it; the Go server ignores it). The
//! header block is HPACK-compressed with a dynamic table that spans the connection, so the
//! rewrite cannot be done on bytes: every HEADERS frame (with its CONTINUATION frames) the
//! client sends is decoded, in order, with the table the client encodes against, and written
//! again with literals that never enter the server's table (so the server's table stays empty
//! and in step whatever the client indexed). Every other frame passes unchanged, and a stream
//! that does not start with HTTP/2's client preface is passed through untouched. What the
//! layer cannot parse (a header block HPACK refuses, a frame out of HTTP/2's order: the server
//! would end the connection too) or will not hold (a header block over [`MAX_HEADER_BLOCK`])
//! ends the connection.
//!
//! The kubelet stand-ins use [`Rewrite::outbound`] the other way: their client (tonic, which
//! cannot even represent such an authority) sends exactly what kubelet's grpc-go sends.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod raw;

/// What an authority the HTTP/2 server refuses is rewritten to.
pub const LOCALHOST: &str = "localhost";

/// The largest header block (HEADERS and CONTINUATION fragments together, and the header list
/// they decode to, counted as HPACK counts it) the layer accepts: four times the 16 KiB list
/// the server accepts, so a request the server would refuse for its size still reaches it.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// HTTP/2's client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The frame size every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's initial value); the
/// rewritten header block is cut into frames of at most this.
const FRAME_SIZE: usize = 16 * 1024;
/// The HPACK table size the client encodes against: the server's SETTINGS_HEADER_TABLE_SIZE,
/// which tonic's server leaves at HTTP/2's initial value.
const TABLE_SIZE: usize = 4096;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// What the layer does with a request's `:authority`.
#[derive(Clone, Debug)]
enum Policy {
    /// The server side: an authority the `http` crate refuses becomes [`LOCALHOST`].
    Accept,
    /// The client side: every authority becomes these bytes.
    Send(Vec<u8>),
}

impl Policy {
    fn authority<'a>(&'a self, value: &'a [u8]) -> Cow<'a, [u8]> {
        match self {
            Policy::Accept if http::uri::Authority::try_from(value).is_ok() => Cow::Borrowed(value),
            Policy::Accept => Cow::Borrowed(LOCALHOST.as_bytes()),
            Policy::Send(bytes) => Cow::Borrowed(bytes),
        }
    }
}

/// Where the parser is in the byte stream.
#[derive(Clone, Copy, Debug)]
enum Position {
    /// Before the client preface.
    Preface,
    /// At a frame header.
    Frame,
    /// Inside the payload of a frame passed unchanged: this many bytes left.
    Payload(usize),
    /// Not HTTP/2 with prior knowledge: everything passes.
    Passthrough,
}

/// A header block being collected: the HEADERS frame's stream, flags and priority, and the
/// fragments so far.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server byte stream of an HTTP/2 connection, with every header block decoded
/// and written again with the authority [`Policy`] gives.
struct Rewriter {
    policy: Policy,
    position: Position,
    /// Bytes received and not yet consumed (a partial frame header or HEADERS frame).
    input: BytesMut,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    /// The block being decoded with its strings raw ([`raw::unhuffman`]), kept for the next.
    raw: Vec<u8>,
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 header rewriting: {}", what.into()),
    )
}

impl Rewriter {
    fn new(policy: Policy) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Self {
            policy,
            position: Position::Preface,
            input: BytesMut::new(),
            block: None,
            decoder,
            raw: Vec::new(),
        }
    }

    /// Consumes `data` and appends what the server is to see to `out`.
    fn feed(&mut self, data: &[u8], out: &mut BytesMut) -> io::Result<()> {
        if let Position::Passthrough = self.position {
            out.extend_from_slice(data);
            return Ok(());
        }
        self.input.extend_from_slice(data);
        loop {
            match self.position {
                Position::Passthrough => {
                    out.extend_from_slice(&self.input.split());
                    return Ok(());
                }
                Position::Preface => {
                    let n = self.input.len().min(PREFACE.len());
                    if self.input[..n] != PREFACE[..n] {
                        self.position = Position::Passthrough;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return Ok(());
                    }
                    out.extend_from_slice(&self.input.split_to(PREFACE.len()));
                    self.position = Position::Frame;
                }
                Position::Payload(left) => {
                    let n = left.min(self.input.len());
                    out.extend_from_slice(&self.input.split_to(n));
                    if n < left {
                        self.position = Position::Payload(left - n);
                        return Ok(());
                    }
                    self.position = Position::Frame;
                }
                Position::Frame => {
                    if self.input.len() < 9 {
                        return Ok(());
                    }
                    let head = &self.input[..9];
                    let length = usize::from(head[0]) << 16
                        | usize::from(head[1]) << 8
                        | usize::from(head[2]);
                    let kind = head[3];
                    let flags = head[4];
                    let stream =
                        u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                    let in_block = self.block.is_some();
                    if in_block && kind != CONTINUATION {
                        return Err(invalid(format!(
                            "frame type {kind} inside the header block of stream {stream}"
                        )));
                    }
                    if kind != HEADERS && kind != CONTINUATION {
                        out.extend_from_slice(&self.input.split_to(9));
                        self.position = Position::Payload(length);
                        continue;
                    }
                    if length > MAX_HEADER_BLOCK {
                        return Err(invalid(format!("a {length}-byte header frame")));
                    }
                    if self.input.len() < 9 + length {
                        return Ok(());
                    }
                    self.input.advance(9);
                    let payload = self.input.split_to(length);
                    if kind == HEADERS {
                        self.headers(stream, flags, &payload)?;
                    } else {
                        self.continuation(stream, &payload)?;
                    }
                    if flags & END_HEADERS != 0 {
                        self.finish(out)?;
                    }
                }
            }
        }
    }

    /// A HEADERS frame's payload: padding and priority taken off, a block started.
    fn headers(&mut self, stream: u32, flags: u8, mut payload: &[u8]) -> io::Result<()> {
        if self.block.is_some() {
            return Err(invalid("HEADERS inside a header block"));
        }
        if flags & PADDED != 0 {
            let (&pad, rest) = payload
                .split_first()
                .ok_or_else(|| invalid("padded HEADERS without a pad length"))?;
            let keep = rest
                .len()
                .checked_sub(usize::from(pad))
                .ok_or_else(|| invalid("HEADERS padding longer than the frame"))?;
            payload = &rest[..keep];
        }
        let priority = if flags & PRIORITY != 0 {
            if payload.len() < 5 {
                return Err(invalid("HEADERS priority cut short"));
            }
            let (priority, rest) = payload.split_at(5);
            payload = rest;
            let mut p = [0u8; 5];
            p.copy_from_slice(priority);
            Some(p)
        } else {
            None
        };
        self.block = Some(Block {
            stream,
            end_stream: flags & END_STREAM != 0,
            priority,
            fragment: payload.to_vec(),
        });
        Ok(())
    }

    fn continuation(&mut self, stream: u32, payload: &[u8]) -> io::Result<()> {
        let block = self
            .block
            .as_mut()
            .filter(|b| b.stream == stream)
            .ok_or_else(|| invalid(format!("CONTINUATION of stream {stream} out of a block")))?;
        if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
            return Err(invalid("a header block over the limit"));
        }
        block.fragment.extend_from_slice(payload);
        Ok(())
    }

    /// Decodes the finished block and writes it again, as HEADERS and CONTINUATION frames.
    fn finish(&mut self, out: &mut BytesMut) -> io::Result<()> {
        let Some(block) = self.block.take() else {
            return Err(invalid("END_HEADERS without a header block"));
        };
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        if let Some(priority) = block.priority {
            encoded.extend_from_slice(&priority);
        }
        self.raw.clear();
        raw::unhuffman(&block.fragment, &mut self.raw)
            .map_err(|e| invalid(format!("HPACK: {e}")))?;
        let mut listed = 0usize;
        let policy = &self.policy;
        self.decoder
            .decode_with_cb(&self.raw, |name, value| {
                listed += name.len() + value.len() + 32;
                // Indexed fields cost a byte each and may name 4 KiB of table: past the limit
                // nothing more is written (the block is refused below).
                if listed > MAX_HEADER_BLOCK {
                    return;
                }
                let value = if name.as_ref() == b":authority" {
                    policy.authority(&value)
                } else {
                    value
                };
                literal(&name, &value, &mut encoded);
            })
            .map_err(|e| invalid(format!("HPACK: {e}")))?;
        if listed > MAX_HEADER_BLOCK {
            return Err(invalid(format!("a {listed}-byte header list")));
        }
        // An empty block is still one HEADERS frame.
        let mut chunks: Vec<&[u8]> = encoded.chunks(FRAME_SIZE).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let count = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let (kind, mut flags) = if i == 0 {
                let mut flags = 0;
                if block.end_stream {
                    flags |= END_STREAM;
                }
                if block.priority.is_some() {
                    flags |= PRIORITY;
                }
                (HEADERS, flags)
            } else {
                (CONTINUATION, 0)
            };
            if i + 1 == count {
                flags |= END_HEADERS;
            }
            let length = chunk.len().to_be_bytes();
            out.extend_from_slice(&length[length.len() - 3..]);
            out.extend_from_slice(&[kind, flags]);
            out.extend_from_slice(&block.stream.to_be_bytes());
            out.extend_from_slice(chunk);
        }
        Ok(())
    }
}

/// A header field as a literal without indexing, with a literal name (RFC 7541 6.2.2): it never
/// enters the receiver's dynamic table.
fn literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0);
    for s in [name, value] {
        // Writing to a Vec cannot fail.
        let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// Which direction of the connection is rewritten.
enum Side {
    /// What is read (a server's accepted connection).
    Inbound { decoded: BytesMut, eof: bool },
    /// What is written (a client's connection).
    Outbound { pending: BytesMut },
}

/// A connection whose client-to-server HTTP/2 header blocks are rewritten (see the module).
pub struct Rewrite<S> {
    inner: S,
    rewriter: Rewriter,
    side: Side,
}

impl<S> Rewrite<S> {
    /// A server's accepted connection: requests whose `:authority` the HTTP/2 server would
    /// refuse reach it with [`LOCALHOST`] instead.
    pub fn inbound(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(Policy::Accept),
            side: Side::Inbound {
                decoded: BytesMut::new(),
                eof: false,
            },
        }
    }

    /// A client's connection: every request goes out with `authority` as its `:authority`,
    /// whatever the client put there (kubelet's own bytes, which `http::Uri` cannot hold).
    pub fn outbound(inner: S, authority: impl Into<Vec<u8>>) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(Policy::Send(authority.into())),
            side: Side::Outbound {
                pending: BytesMut::new(),
            },
        }
    }

    /// The connection underneath.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncWrite + Unpin> Rewrite<S> {
    /// Writes what the rewriter produced until none is left.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Side::Outbound { pending } = &mut self.side else {
            return Poll::Ready(Ok(()));
        };
        while !pending.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            pending.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewrite<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Side::Inbound { decoded, eof } = &mut this.side else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        loop {
            if !decoded.is_empty() {
                let n = decoded.len().min(buf.remaining());
                buf.put_slice(&decoded.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if *eof {
                return Poll::Ready(Ok(()));
            }
            let mut raw = [0u8; 8192];
            let mut raw = ReadBuf::new(&mut raw);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut raw))?;
            if raw.filled().is_empty() {
                *eof = true;
                continue;
            }
            this.rewriter.feed(raw.filled(), decoded)?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewrite<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Side::Inbound { .. } = this.side {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        ready!(this.drain(cx))?;
        if let Side::Outbound { pending } = &mut this.side {
            this.rewriter.feed(buf, pending)?;
        }
        // Written as far as the socket takes now; the rest goes with the next write or flush.
        if let Poll::Ready(Err(e)) = this.drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Side::Inbound { .. } = this.side {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        Pin::new(this).poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        matches!(self.side, Side::Inbound { .. }) && self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Rewrite<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Every connection `listener` accepts, wrapped by [`Rewrite::inbound`]: the incoming stream for
/// tonic's `serve_with_incoming*` on a socket kubelet dials.
pub fn incoming(
    listener: tokio::net::UnixListener,
) -> impl futures::Stream<Item = io::Result<Rewrite<tokio::net::UnixStream>>> {
    use futures::StreamExt;
    tokio_stream::wrappers::UnixListenerStream::new(listener).map(|c| c.map(Rewrite::inbound))
}

/// The `:authority` grpc-go sends for a target without a scheme, which kubelet dials as the bare
/// socket path: the path with every byte outside RFC 3986's unreserved, sub-delims and `:[]@`
/// percent-encoded (`encodeAuthority` in grpc-go's `clientconn.go`).
pub fn grpc_go_passthrough(path: &std::path::Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::new();
    for &b in path.as_os_str().as_bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'_'
                    | b'.'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'['
                    | b']'
                    | b'@'
            );
        if keep {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request header block the way grpc-go's encoder writes one: indexed names, literals
    /// with incremental indexing (so the second request refers to the table).
    fn request(encoder: &mut loona_hpack::Encoder<'static>, authority: &[u8]) -> Vec<u8> {
        let fields: [(&[u8], &[u8]); 6] = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ];
        encoder.encode(fields)
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![
            (payload.len() >> 16) as u8,
            (payload.len() >> 8) as u8,
            payload.len() as u8,
            kind,
            flags,
        ];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A decoded header list: (name, value) pairs.
    type List = Vec<(Vec<u8>, Vec<u8>)>;

    /// Every header block in `wire` (a client's stream after the preface): stream, flags, list.
    fn decode_all(wire: &[u8]) -> Vec<(u32, u8, List)> {
        assert!(wire.starts_with(PREFACE));
        let mut rest = &wire[PREFACE.len()..];
        let mut decoder = loona_hpack::Decoder::new();
        let mut out = Vec::new();
        let mut block = Vec::new();
        let mut head = (0, 0);
        while rest.len() >= 9 {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            let payload = &rest[9..9 + len];
            if kind == HEADERS {
                head = (stream, flags);
                // The rewriter never pads; a priority comes first.
                let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                block.extend_from_slice(&payload[skip..]);
            } else if kind == CONTINUATION {
                block.extend_from_slice(payload);
            }
            if (kind == HEADERS || kind == CONTINUATION) && flags & END_HEADERS != 0 {
                out.push((head.0, head.1, decoder.decode(&block).unwrap()));
                block.clear();
            }
            rest = &rest[9 + len..];
        }
        assert!(rest.is_empty());
        out
    }

    fn authority_of(list: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
        &list.iter().find(|(n, _)| n == b":authority").unwrap().1
    }

    #[test]
    fn refused_authorities_become_localhost_and_the_rest_is_kept_whatever_is_indexed() {
        let encoded = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdevices.wdp.dev-reg.sock";
        let mut encoder = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(0x4, 0, 0, &[]));
        // The first request adds the authority to the client's table, the second refers to it.
        wire.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &request(&mut encoder, encoded),
        ));
        wire.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        wire.extend(frame(
            HEADERS,
            END_HEADERS,
            3,
            &request(&mut encoder, encoded),
        ));
        // Split across HEADERS and CONTINUATION, padded, with priority.
        let block = request(&mut encoder, b"/var/lib/kubelet/plugins/x/dra.sock");
        let (a, b) = block.split_at(block.len() / 2);
        let mut first = vec![3];
        first.extend_from_slice(&[0, 0, 0, 0, 15]);
        first.extend_from_slice(a);
        first.extend_from_slice(&[0, 0, 0]);
        wire.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &first));
        wire.extend(frame(CONTINUATION, END_HEADERS, 5, b));
        wire.extend(frame(
            HEADERS,
            END_HEADERS,
            7,
            &request(&mut encoder, b"localhost"),
        ));
        // Fed byte by byte: every frame boundary cut everywhere.
        let mut rewriter = Rewriter::new(Policy::Accept);
        let mut out = BytesMut::new();
        for byte in &wire {
            rewriter.feed(std::slice::from_ref(byte), &mut out).unwrap();
        }
        let blocks = decode_all(&out);
        let streams: Vec<u32> = blocks.iter().map(|b| b.0).collect();
        assert_eq!(streams, [1, 3, 5, 7]);
        for (_, _, list) in &blocks[..3] {
            assert_eq!(authority_of(list), b"localhost");
            assert_eq!(list[2].1, b"/pluginregistration.Registration/GetInfo");
            assert_eq!(list.len(), 6);
        }
        assert_eq!(authority_of(&blocks[3].2), b"localhost");
        assert_eq!(blocks[2].1, END_STREAM | PRIORITY | END_HEADERS);
        // The DATA frame passed unchanged.
        let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
        assert!(out.windows(data.len()).any(|w| w == data));
    }

    #[test]
    fn a_client_sends_exactly_the_authority_it_is_given() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &request(&mut encoder, b"localhost"),
        ));
        let sent = grpc_go_passthrough(std::path::Path::new(
            "/var/lib/kubelet/plugins_registry/devices.wdp.dev-reg.sock",
        ));
        assert_eq!(
            sent,
            b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fdevices.wdp.dev-reg.sock"
        );
        let mut rewriter = Rewriter::new(Policy::Send(sent.clone()));
        let mut out = BytesMut::new();
        rewriter.feed(&wire, &mut out).unwrap();
        assert_eq!(authority_of(&decode_all(&out)[0].2), sent);
    }

    #[test]
    fn what_is_not_http2_passes_and_what_breaks_its_order_ends_the_connection() {
        let mut rewriter = Rewriter::new(Policy::Accept);
        let mut out = BytesMut::new();
        rewriter.feed(b"GET / HTTP/1.1\r\n\r\n", &mut out).unwrap();
        assert_eq!(&out[..], b"GET / HTTP/1.1\r\n\r\n");

        let mut wire = PREFACE.to_vec();
        wire.extend(frame(HEADERS, 0, 1, &[0x82]));
        wire.extend(frame(0x0, 0, 1, &[]));
        let mut rewriter = Rewriter::new(Policy::Accept);
        assert!(rewriter.feed(&wire, &mut BytesMut::new()).is_err());

        let mut wire = PREFACE.to_vec();
        wire.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0x7f]));
        let mut rewriter = Rewriter::new(Policy::Accept);
        assert!(
            rewriter.feed(&wire, &mut BytesMut::new()).is_err(),
            "an index past the tables"
        );

        let mut wire = PREFACE.to_vec();
        wire.extend(frame(HEADERS, 0, 1, &[]));
        for _ in 0..5 {
            wire.extend(frame(CONTINUATION, 0, 1, &[0; FRAME_SIZE]));
        }
        let mut rewriter = Rewriter::new(Policy::Accept);
        assert!(
            rewriter.feed(&wire, &mut BytesMut::new()).is_err(),
            "a block over the limit"
        );

        // One 4000-byte field in the table, then a byte per reference to it: 40 MB of headers
        // from a 14 KB block, refused.
        let big = [b'a'; 4000];
        let fields: [(&[u8], &[u8]); 1] = [(b"x", &big)];
        let mut block = loona_hpack::Encoder::new().encode(fields);
        block.extend([0x80 | 62; 10_000]);
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let mut rewriter = Rewriter::new(Policy::Accept);
        assert!(
            rewriter.feed(&wire, &mut BytesMut::new()).is_err(),
            "a header list over the limit"
        );
    }

    /// Answers Register, so a call shows whether the request reached the service.
    struct Answer;

    #[tonic::async_trait]
    impl crate::api::registration_server::Registration for Answer {
        async fn register(
            &self,
            _: tonic::Request<crate::api::RegisterRequest>,
        ) -> Result<tonic::Response<crate::api::Empty>, tonic::Status> {
            Ok(tonic::Response::new(crate::api::Empty {}))
        }
    }

    /// A Register call on `socket` whose request carries `authority`.
    async fn call(socket: &std::path::Path, authority: &[u8]) -> Result<(), tonic::Status> {
        let channel = crate::transport::connect_with_authority(socket, authority.to_vec())
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        crate::api::registration_client::RegistrationClient::new(channel)
            .register(crate::api::RegisterRequest::default())
            .await
            .map(|_| ())
    }

    #[tokio::test]
    async fn every_authority_kubelet_and_other_grpc_clients_send_reaches_the_service() {
        use crate::api::registration_server::RegistrationServer;
        let dir = tempfile::tempdir().unwrap();
        let served = dir.path().join("served.sock");
        let plain = dir.path().join("plain.sock");
        let server =
            || tonic::transport::Server::builder().add_service(RegistrationServer::new(Answer));
        tokio::spawn(
            server()
                .serve_with_incoming(incoming(tokio::net::UnixListener::bind(&served).unwrap())),
        );
        // The same server without the layer: what tonic does on its own.
        tokio::spawn(server().serve_with_incoming(
            tokio_stream::wrappers::UnixListenerStream::new(
                tokio::net::UnixListener::bind(&plain).unwrap(),
            ),
        ));
        let registry = "/var/lib/kubelet/plugins_registry/devices.wdp.dev-reg.sock";
        let refused: [&[u8]; 3] = [
            // kubelet's plugin watcher (every release), and its DRA manager up to 1.33.
            &grpc_go_passthrough(std::path::Path::new(registry)),
            // grpc-java, and a bare path.
            registry.as_bytes(),
            // gRPC C-core (Python) for `unix:/var/lib/...`.
            b"var%2Flib%2Fkubelet%2Fplugins_registry%2Fdevices.wdp.dev-reg.sock",
        ];
        for authority in refused {
            let shown = String::from_utf8_lossy(authority);
            call(&served, authority)
                .await
                .unwrap_or_else(|e| panic!("{shown}: {e}"));
            let e = call(&plain, authority)
                .await
                .expect_err("h2 on its own refuses it");
            assert!(
                format!("{e:?}").contains("PROTOCOL_ERROR"),
                "{shown}: {e:?}"
            );
        }
        // `unix:` targets (kubelet's DRA manager from 1.34) and the device-plugin client.
        call(&served, b"localhost").await.unwrap();
        call(&plain, b"localhost").await.unwrap();
    }
}
