//! A byte tunnel over a message stream, with flow control: how `kubectl exec` at the
//! federation reaches a pod in a shard over the one gRPC stream the shard opened. Each end
//! runs [`pump`] between its local connection (the client's, or the pod stream the shard
//! opened) and the messages of the other end.
//!
//! Flow control is by credit, per tunnel, as HTTP/2 does per stream: a side may have at most
//! [`WINDOW`] units of pieces unacknowledged; a piece costs its length plus [`PIECE_COST`]
//! (so a storm of one-byte pieces also runs out of credit). The receiving side returns the
//! credit as it writes pieces to its connection, in batches of a quarter window. A client
//! that stops reading therefore stops its own tunnel only — never the shared stream — and a
//! peer that sends past its credit has the tunnel closed on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};

/// Credit each side starts with, in cost units.
pub const WINDOW: u32 = 1 << 20;
/// What a piece costs beyond its bytes.
pub const PIECE_COST: u32 = 512;
/// The largest piece read from the local connection and sent.
pub const PIECE: usize = 32 << 10;

/// One message of a tunnel, either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes of the connection.
    Data(Vec<u8>),
    /// Credit returned: pieces worth this much were delivered.
    Ack(u64),
    /// The sender's side will send no more bytes.
    End,
}

/// What a piece of `len` bytes costs.
pub fn cost(len: usize) -> u64 {
    len as u64 + u64::from(PIECE_COST)
}

/// Why a tunnel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Both sides ended their output.
    Done,
    /// The other end's messages stopped (it cancelled, or the stream is gone).
    Gone,
    /// The local connection failed, or a message could not be sent.
    Broken,
    /// The other end sent past its credit.
    Overrun,
}

/// Runs a tunnel: the bytes `io` gives are sent as pieces with `send` (false once the
/// stream is gone), the pieces `inbound` brings are written to `io`. Returns when both
/// sides have ended their output, or at the first failure.
pub async fn pump<T, S, F>(io: T, mut inbound: S, send: F) -> Ended
where
    T: AsyncRead + AsyncWrite + Send + 'static,
    S: Stream<Item = Piece> + Send + Unpin,
    F: Fn(Piece) -> bool + Send + Sync,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    // Cost received and not yet returned: past the window, the peer broke the protocol.
    let held = AtomicU64::new(0);
    let (to_writer, mut writes) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
    let send = &send;
    let reader = async {
        let mut buf = vec![0u8; PIECE];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) => return send(Piece::End),
                Ok(n) => n,
                Err(_) => return false,
            };
            let units = u32::try_from(cost(n)).unwrap_or(WINDOW);
            match credit.acquire_many(units).await {
                Ok(p) => p.forget(),
                Err(_) => return false,
            }
            if !send(Piece::Data(buf[..n].to_vec())) {
                return false;
            }
        }
    };
    let writer = async {
        let mut owed = 0u64;
        while let Some(next) = writes.recv().await {
            let Some(bytes) = next else {
                return wr.shutdown().await.is_ok();
            };
            if wr.write_all(&bytes).await.is_err() {
                return false;
            }
            let c = cost(bytes.len());
            held.fetch_sub(c, Ordering::AcqRel);
            owed += c;
            // Credit goes back in batches, and whenever nothing more is queued. A peer that
            // has already finished needs none: a failed send is no failure here.
            if owed >= u64::from(WINDOW / 4) || writes.is_empty() {
                if wr.flush().await.is_err() {
                    return false;
                }
                send(Piece::Ack(owed));
                owed = 0;
            }
        }
        false
    };
    let dispatch = async {
        let mut ended = false;
        while let Some(p) = inbound.next().await {
            match p {
                Piece::Ack(n) => {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    // Never more than the window in total: a peer cannot inflate it.
                    let room = (WINDOW as usize).saturating_sub(credit.available_permits());
                    credit.add_permits(n.min(room));
                }
                Piece::Data(bytes) => {
                    let c = cost(bytes.len());
                    if held.fetch_add(c, Ordering::AcqRel) + c > u64::from(WINDOW) {
                        return Ended::Overrun;
                    }
                    let _ = to_writer.send(Some(bytes));
                }
                Piece::End => {
                    ended = true;
                    let _ = to_writer.send(None);
                }
            }
        }
        if ended {
            // The peer finished its output and left (its end is done): what it sent is
            // still written out; the tunnel ends as the local side does.
            std::future::pending::<()>().await;
        }
        Ended::Gone
    };
    let both = async {
        let (r, w) = tokio::join!(reader, writer);
        if r && w { Ended::Done } else { Ended::Broken }
    };
    tokio::select! {
        e = both => e,
        e = dispatch => e,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use tokio::io::{DuplexStream, duplex};

    fn stream_of(mut rx: mpsc::UnboundedReceiver<Piece>) -> impl Stream<Item = Piece> + Unpin {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    /// Two pumps back to back, as the federation's and the shard's are over a stream: what
    /// is written at one local end comes out at the other. Also counts the data bytes A
    /// sent.
    fn joined() -> (
        DuplexStream,
        DuplexStream,
        Arc<AtomicUsize>,
        tokio::task::JoinHandle<(Ended, Ended)>,
    ) {
        let (a_local, a_side) = duplex(4096);
        let (b_local, b_side) = duplex(4096);
        let (to_b, from_a) = mpsc::unbounded_channel::<Piece>();
        let (to_a, from_b) = mpsc::unbounded_channel::<Piece>();
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        let task = tokio::spawn(async move {
            let a = pump(a_side, stream_of(from_b), move |p| {
                if let Piece::Data(d) = &p {
                    counted.fetch_add(d.len(), Ordering::SeqCst);
                }
                to_b.send(p).is_ok()
            });
            let b = pump(b_side, stream_of(from_a), move |p| to_a.send(p).is_ok());
            tokio::join!(a, b)
        });
        (a_local, b_local, sent, task)
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_half_closes_carry_through() {
        let (mut a, mut b, _, task) = joined();
        let up = pattern(3 << 20, 7);
        let down = pattern(2 << 20, 9);
        let (up2, down2) = (up.clone(), down.clone());
        let a_side = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(&mut a);
            let write = async {
                w.write_all(&up2).await.expect("a writes");
                w.shutdown().await.expect("a shuts");
            };
            let mut got = Vec::new();
            let read = r.read_to_end(&mut got);
            let (_, n) = tokio::join!(write, read);
            n.expect("a reads");
            got
        });
        let (mut r, mut w) = tokio::io::split(&mut b);
        let write = async {
            w.write_all(&down2).await.expect("b writes");
            w.shutdown().await.expect("b shuts");
        };
        let mut got_b = Vec::new();
        let read = r.read_to_end(&mut got_b);
        let (_, n) = tokio::join!(write, read);
        n.expect("b reads");
        assert_eq!(got_b.len(), up.len());
        assert!(got_b == up, "A's bytes arrive at B in order");
        let got_a = a_side.await.expect("a");
        assert!(got_a == down, "B's bytes arrive at A in order");
        let (ea, eb) = task.await.expect("pumps");
        assert_eq!((ea, eb), (Ended::Done, Ended::Done));
    }

    #[tokio::test]
    async fn a_reader_that_stops_holds_its_sender_to_one_window() {
        let (mut a, mut b, sent, _task) = joined();
        let total = 8 << 20;
        let writer = tokio::spawn(async move {
            a.write_all(&pattern(total, 1)).await.expect("write");
            a
        });
        // B's local end is not read: A may send at most its window, plus what B's end
        // buffers (B returns credit for what it wrote there).
        for _ in 0..20 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let in_flight = sent.load(Ordering::SeqCst);
        assert!(
            in_flight <= WINDOW as usize + 4096,
            "{in_flight} bytes sent to a reader that reads nothing"
        );
        assert!(!writer.is_finished(), "the writer is held back");
        let mut got = vec![0u8; total];
        b.read_exact(&mut got).await.expect("read all");
        assert!(got == pattern(total, 1));
        writer.await.expect("writer ends once read");
    }

    #[tokio::test]
    async fn a_peer_past_its_credit_or_gone_ends_the_tunnel() {
        // Nothing reads the local end, so nothing is acknowledged: a peer that keeps
        // sending is over its window after 1 MiB.
        let (_local, side) = duplex(1024);
        let (tx, rx) = mpsc::unbounded_channel();
        for _ in 0..40 {
            tx.send(Piece::Data(vec![0u8; 32 << 10])).expect("queue");
        }
        let ended = pump(side, stream_of(rx), |_| true).await;
        assert_eq!(ended, Ended::Overrun);

        let (_local, side) = duplex(1024);
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Piece::Ack(u64::MAX))
            .expect("an inflated ack is capped");
        drop(tx);
        assert_eq!(pump(side, stream_of(rx), |_| true).await, Ended::Gone);
    }
}
