//! SPDY/3.1 framing, as much of it as Kubernetes' streaming protocols use: the server side of
//! a connection whose client opens streams (port-forward's `error` and `data` pairs).
//!
//! A frame is 8 bytes of header and a payload. A control frame's header holds the version
//! (3), its type, flags and the payload's length (24 bits); a data frame's holds the stream
//! id, flags and length. The name/value header blocks of SYN_STREAM, SYN_REPLY and HEADERS
//! are compressed with zlib, one stream per direction for the whole connection, each block
//! ending in a sync flush; the client's stream starts from SPDY/3's preset dictionary
//! (`spdy3.dict`, from the protocol's draft 3).
//!
//! Go's implementation (the one kubectl uses) has no flow control: WINDOW_UPDATE and
//! SETTINGS are read and ignored here, as there.

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt};

/// SPDY/3's zlib dictionary for header blocks (1,423 bytes; its Adler-32 is `0xe3c6a7c2`).
pub const DICTIONARY: &[u8] = include_bytes!("spdy3.dict");

/// The largest frame payload read. Go's client writes data as `io.Copy` hands it over
/// (32 KiB); header blocks are small. A larger frame ends the connection.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// The largest decompressed header block.
const MAX_HEADER_BLOCK: usize = 64 * 1024;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;

/// The FIN flag (the sender will send no more on the stream).
pub const FLAG_FIN: u8 = 0x01;

/// RST_STREAM status: the stream is refused or broken (PROTOCOL_ERROR).
pub const PROTOCOL_ERROR: u32 = 1;
/// RST_STREAM status: the stream is no longer wanted (CANCEL).
pub const CANCEL: u32 = 5;

/// A frame as read.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// The peer opens stream `id` with `headers` (names lowercase).
    SynStream {
        /// Stream id (odd: the client's).
        id: u32,
        /// The peer sends nothing more on it.
        fin: bool,
        /// Its headers.
        headers: Vec<(String, String)>,
    },
    /// Bytes on stream `id`.
    Data {
        /// Stream id.
        id: u32,
        /// The last bytes the peer sends on it.
        fin: bool,
        /// The bytes.
        data: Bytes,
    },
    /// The peer abandons stream `id`.
    RstStream {
        /// Stream id.
        id: u32,
    },
    /// More headers on a stream (its FIN counts).
    Headers {
        /// Stream id.
        id: u32,
        /// The peer sends nothing more on it.
        fin: bool,
    },
    /// A ping, answered with the same id.
    Ping(u32),
    /// The peer is closing the connection.
    GoAway,
    /// A frame this side has no use for (SETTINGS, WINDOW_UPDATE, a SYN_REPLY).
    Ignored,
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// Decompresses the peer's header blocks: one zlib stream over the connection.
pub struct Inflater {
    inner: Decompress,
    started: bool,
}

impl Default for Inflater {
    fn default() -> Self {
        Inflater {
            inner: Decompress::new(false),
            started: false,
        }
    }
}

impl Inflater {
    /// The raw deflate stream is primed with the dictionary as a stored block: what follows
    /// may refer back into it exactly as into a preset dictionary (the zlib header, with its
    /// dictionary id, is skipped).
    fn start(&mut self, block: &[u8]) -> io::Result<usize> {
        let [cmf, flg, ..] = *block else {
            return Err(invalid("a header block shorter than its zlib header"));
        };
        if cmf & 0x0f != 8 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
            return Err(invalid("a header block that is not a zlib stream"));
        }
        let mut skip = 2;
        if flg & 0x20 != 0 {
            let id = block
                .get(2..6)
                .ok_or_else(|| invalid("a header block cut in its dictionary id"))?;
            if u32::from_be_bytes([id[0], id[1], id[2], id[3]]) != adler32(DICTIONARY) {
                return Err(invalid("a header block compressed with another dictionary"));
            }
            let len = DICTIONARY.len() as u16;
            let mut stored = vec![0u8];
            stored.extend_from_slice(&len.to_le_bytes());
            stored.extend_from_slice(&(!len).to_le_bytes());
            stored.extend_from_slice(DICTIONARY);
            let mut sink = Vec::with_capacity(DICTIONARY.len() + 16);
            self.inner
                .decompress_vec(&stored, &mut sink, FlushDecompress::Sync)
                .map_err(|e| invalid(format!("priming the header dictionary: {e}")))?;
            skip = 6;
        }
        self.started = true;
        Ok(skip)
    }

    /// The name/value pairs of one compressed header block.
    pub fn headers(&mut self, block: &[u8]) -> io::Result<Vec<(String, String)>> {
        let mut input = block;
        if !self.started {
            let skip = self.start(block)?;
            input = &block[skip..];
        }
        let mut out = Vec::with_capacity(256);
        loop {
            out.reserve(1024);
            let before = self.inner.total_in();
            let status = self
                .inner
                .decompress_vec(input, &mut out, FlushDecompress::Sync)
                .map_err(|e| invalid(format!("a header block does not decompress: {e}")))?;
            let used = (self.inner.total_in() - before) as usize;
            input = &input[used..];
            if out.len() > MAX_HEADER_BLOCK {
                return Err(invalid("a header block larger than 64 KiB"));
            }
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            if status == Status::StreamEnd || (used == 0 && out.len() < out.capacity()) {
                break;
            }
        }
        parse_block(&out)
    }
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    b << 16 | a
}

fn parse_block(mut raw: &[u8]) -> io::Result<Vec<(String, String)>> {
    let mut take = |n: usize| -> io::Result<&[u8]> {
        if raw.len() < n {
            return Err(invalid("a header block cut short"));
        }
        let (head, rest) = raw.split_at(n);
        raw = rest;
        Ok(head)
    };
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = word(take(4)?);
    let mut pairs = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let n = word(take(4)?);
        let name = String::from_utf8_lossy(take(n)?).to_ascii_lowercase();
        let n = word(take(4)?);
        let value = String::from_utf8_lossy(take(n)?).into_owned();
        // Several values of one name are separated by NUL.
        for v in value.split('\0') {
            pairs.push((name.clone(), v.to_owned()));
        }
    }
    Ok(pairs)
}

/// Compresses this side's header blocks: one zlib stream (no dictionary) over the
/// connection, each block sync-flushed so the peer can read it whole.
pub struct Deflater {
    inner: Compress,
}

impl Default for Deflater {
    fn default() -> Self {
        Deflater {
            inner: Compress::new(Compression::fast(), true),
        }
    }
}

/// A name/value header block, uncompressed.
fn raw_block(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut raw = Vec::new();
    raw.put_u32(headers.len() as u32);
    for (name, value) in headers {
        raw.put_u32(name.len() as u32);
        raw.put_slice(name.as_bytes());
        raw.put_u32(value.len() as u32);
        raw.put_slice(value.as_bytes());
    }
    raw
}

/// `raw` through `compress`, sync-flushed so the reader gets all of it.
fn compress_block(compress: &mut Compress, raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + 64);
    let mut input = raw;
    loop {
        out.reserve(256);
        let before = compress.total_in();
        // Compressing into a Vec with room cannot fail.
        let _ = compress.compress_vec(input, &mut out, FlushCompress::Sync);
        input = &input[(compress.total_in() - before) as usize..];
        if input.is_empty() && out.len() < out.capacity() {
            return out;
        }
    }
}

impl Deflater {
    fn block(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        compress_block(&mut self.inner, &raw_block(headers))
    }
}

fn control(out: &mut BytesMut, kind: u16, flags: u8, len: usize) {
    out.put_u16(0x8000 | 3);
    out.put_u16(kind);
    out.put_u8(flags);
    out.put_uint(len as u64, 3);
}

/// A SYN_REPLY for stream `id` with `headers`.
pub fn syn_reply(deflater: &mut Deflater, id: u32, headers: &[(&str, &str)]) -> Bytes {
    let block = deflater.block(headers);
    let mut out = BytesMut::with_capacity(12 + block.len());
    control(&mut out, SYN_REPLY, 0, 4 + block.len());
    out.put_u32(id & 0x7fff_ffff);
    out.put_slice(&block);
    out.freeze()
}

/// A DATA frame.
pub fn data(id: u32, fin: bool, bytes: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(8 + bytes.len());
    out.put_u32(id & 0x7fff_ffff);
    out.put_u8(if fin { FLAG_FIN } else { 0 });
    out.put_uint(bytes.len() as u64, 3);
    out.put_slice(bytes);
    out.freeze()
}

/// A RST_STREAM.
pub fn rst_stream(id: u32, status: u32) -> Bytes {
    let mut out = BytesMut::with_capacity(16);
    control(&mut out, RST_STREAM, 0, 8);
    out.put_u32(id & 0x7fff_ffff);
    out.put_u32(status);
    out.freeze()
}

/// A PING (the answer to one).
pub fn ping(id: u32) -> Bytes {
    let mut out = BytesMut::with_capacity(12);
    control(&mut out, PING, 0, 4);
    out.put_u32(id);
    out.freeze()
}

/// A GOAWAY naming the last stream the peer opened that this side took.
pub fn goaway(last: u32) -> Bytes {
    let mut out = BytesMut::with_capacity(16);
    control(&mut out, GOAWAY, 0, 8);
    out.put_u32(last & 0x7fff_ffff);
    out.put_u32(0);
    out.freeze()
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads the next frame; `None` at a clean end of the connection.
pub async fn read_frame(
    r: &mut (impl AsyncRead + Unpin),
    inflater: &mut Inflater,
) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let flags = head[4];
    let len = (usize::from(head[5]) << 16) | (usize::from(head[6]) << 8) | usize::from(head[7]);
    if len > MAX_PAYLOAD {
        return Err(invalid(format!(
            "a frame of {len} bytes (at most {MAX_PAYLOAD})"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    if head[0] & 0x80 == 0 {
        return Ok(Some(Frame::Data {
            id: be32(&head[..4]) & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            data: Bytes::from(payload),
        }));
    }
    let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
    if version != 3 {
        return Err(invalid(format!(
            "SPDY version {version} (this side speaks 3)"
        )));
    }
    let kind = u16::from_be_bytes([head[2], head[3]]);
    let need = |n: usize| {
        if payload.len() < n {
            Err(invalid(format!("a control frame of type {kind} cut short")))
        } else {
            Ok(())
        }
    };
    Ok(Some(match kind {
        SYN_STREAM => {
            need(10)?;
            Frame::SynStream {
                id: be32(&payload) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                headers: inflater.headers(&payload[10..])?,
            }
        }
        RST_STREAM => {
            need(8)?;
            Frame::RstStream {
                id: be32(&payload) & 0x7fff_ffff,
            }
        }
        HEADERS => {
            need(4)?;
            // Read to keep the compression streams in step.
            inflater.headers(&payload[4..])?;
            Frame::Headers {
                id: be32(&payload) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
            }
        }
        SYN_REPLY => {
            need(4)?;
            inflater.headers(&payload[4..])?;
            Frame::Ignored
        }
        PING => {
            need(4)?;
            Frame::Ping(be32(&payload))
        }
        GOAWAY => Frame::GoAway,
        _ => Frame::Ignored,
    }))
}

/// The first value of header `name` among `headers`.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's SYN_STREAM, compressed as Go's framer does: zlib with the dictionary.
    fn client_syn(compress: &mut Compress, id: u32, headers: &[(&str, &str)]) -> Vec<u8> {
        let block = compress_block(compress, &raw_block(headers));
        let mut out = BytesMut::new();
        control(&mut out, SYN_STREAM, 0, 10 + block.len());
        out.put_u32(id);
        out.put_u32(0);
        out.put_u16(0);
        out.put_slice(&block);
        out.to_vec()
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert_eq!(adler32(DICTIONARY), 0xe3c6_a7c2);
        assert!(DICTIONARY.ends_with(b"enq=0."));
    }

    /// A zlib stream that starts from a preset dictionary, built by hand (flate2's pure-Rust
    /// backend cannot set one): header with FDICT, the dictionary's id, then raw deflate
    /// whose window was primed with the dictionary.
    fn dict_compressor() -> (Compress, Vec<u8>) {
        let mut c = Compress::new(Compression::best(), false);
        // Compressing the dictionary itself primes the window; its output is thrown away.
        let mut sink = Vec::with_capacity(4096);
        c.compress_vec(DICTIONARY, &mut sink, FlushCompress::Sync)
            .expect("prime");
        let mut prefix = vec![0x78, 0xf9];
        prefix.extend_from_slice(&adler32(DICTIONARY).to_be_bytes());
        (c, prefix)
    }

    #[tokio::test]
    async fn frames_round_trip_and_header_blocks_share_one_stream() {
        let (mut c, prefix) = dict_compressor();
        let mut first = client_syn(
            &mut c,
            1,
            &[("streamtype", "error"), ("port", "80"), ("requestid", "0")],
        );
        // The zlib prefix goes before the first block's deflate bytes (and the length grows).
        let body_len = first.len() - 8 + prefix.len();
        first.splice(18..18, prefix);
        first[5..8].copy_from_slice(&(body_len as u32).to_be_bytes()[1..]);
        let second = client_syn(
            &mut c,
            3,
            &[("streamtype", "data"), ("port", "80"), ("requestid", "0")],
        );
        let mut wire = first;
        wire.extend_from_slice(&second);
        wire.extend_from_slice(&data(3, true, b"hello"));
        wire.extend_from_slice(&ping(1));
        let mut r = &wire[..];
        let mut inf = Inflater::default();
        let f = read_frame(&mut r, &mut inf)
            .await
            .expect("read")
            .expect("frame");
        let Frame::SynStream { id, headers, .. } = f else {
            panic!("{f:?}")
        };
        assert_eq!(id, 1);
        assert_eq!(header(&headers, "streamtype"), Some("error"));
        let f = read_frame(&mut r, &mut inf)
            .await
            .expect("read")
            .expect("frame");
        let Frame::SynStream { id, headers, .. } = f else {
            panic!("{f:?}")
        };
        assert_eq!((id, header(&headers, "streamtype")), (3, Some("data")));
        assert_eq!(
            read_frame(&mut r, &mut inf).await.expect("read"),
            Some(Frame::Data {
                id: 3,
                fin: true,
                data: Bytes::from_static(b"hello")
            })
        );
        assert_eq!(
            read_frame(&mut r, &mut inf).await.expect("read"),
            Some(Frame::Ping(1))
        );
        assert_eq!(read_frame(&mut r, &mut inf).await.expect("end"), None);
    }

    #[tokio::test]
    async fn replies_decompress_as_a_peer_reads_them() {
        let mut d = Deflater::default();
        let a = syn_reply(&mut d, 1, &[]);
        let b = syn_reply(&mut d, 3, &[("x", "y")]);
        // Read back as a client would: one zlib stream (no dictionary) across both blocks.
        let mut inf = Decompress::new(true);
        for (frame, want) in [(a, 0usize), (b, 1)] {
            assert_eq!(&frame[..4], &[0x80, 3, 0, 2]);
            let mut out = Vec::with_capacity(1024);
            inf.decompress_vec(&frame[12..], &mut out, FlushDecompress::Sync)
                .expect("inflate");
            let pairs = parse_block(&out).expect("block");
            assert_eq!(pairs.len(), want);
        }
    }

    /// Reads frames from `wire` until it ends or fails: never a panic, never more frames than
    /// bytes.
    fn read_all(wire: &[u8]) -> usize {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut r = wire;
            let mut inf = Inflater::default();
            let mut n = 0;
            while let Ok(Some(_)) = read_frame(&mut r, &mut inf).await {
                n += 1;
            }
            n
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Whatever the peer sends — garbage, or control frames with garbage header blocks —
        /// the reader answers a frame or an error.
        #[test]
        fn garbage_never_panics(
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
            kind in 1u16..10,
            block in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            proptest::prop_assert!(read_all(&raw) <= raw.len() / 8);
            // A control frame whose header block is random (after a valid zlib header, so
            // the inflater gets as far as the deflate data).
            let mut payload = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x78, 0x01];
            payload.extend_from_slice(&block);
            let mut frame = BytesMut::new();
            control(&mut frame, kind, 0, payload.len());
            frame.put_slice(&payload);
            read_all(&frame);
        }
    }

    #[tokio::test]
    async fn oversized_frames_and_other_versions_are_refused() {
        let mut big = vec![0u8, 0, 0, 1, 0, 0xff, 0xff, 0xff];
        big.extend_from_slice(&[0; 16]);
        let mut inf = Inflater::default();
        let e = read_frame(&mut &big[..], &mut inf)
            .await
            .expect_err("too big");
        assert!(e.to_string().contains("at most"), "{e}");
        let v2 = [0x80u8, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1];
        let e = read_frame(&mut &v2[..], &mut inf).await.expect_err("v2");
        assert!(e.to_string().contains("version 2"), "{e}");
    }
}
