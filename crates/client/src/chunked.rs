//! Chunks on the client's link (feature `chunks`), so that an urgent
//! message need not wait behind a bulk one on the same connection.
//!
//! Sending: a message goes out chunk by chunk, each chunk a separate turn
//! at the socket. Turns are granted by [`Gate`] to the waiting thread with
//! the most urgent class, so one thread's bulk submit lets another
//! thread's urgent submit through between two of its chunks instead of
//! holding the socket for the whole message.
//!
//! Receiving: the reader thread puts chunked results back together with
//! the codec's bounded [`Reassembler`].

use std::io::{self, Write};
use std::sync::{Condvar, Mutex};

use bytes::Buf;
use corefarm_smp::stream::{ChunkHeader, Reassembler, CLASSES};

/// Results a server may have begun and not finished at once.
pub(crate) const MAX_OPEN: usize = 64;

/// Turns at the socket for chunk writers, by class: strict priority, first
/// come first served within a class (the condvar's order, roughly). No
/// anti-starvation guard: a program that floods class 0 from one thread
/// asked for its bulk to wait.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    st: Mutex<GateState>,
    cond: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    busy: bool,
    waiting: [u32; CLASSES as usize],
}

impl GateState {
    fn more_urgent_waiting(&self, class: usize) -> bool {
        self.waiting[..class].iter().any(|&n| n > 0)
    }
}

/// One turn; the next waiter is chosen when it ends.
pub(crate) struct Turn<'a>(&'a Gate);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = self.0.st.lock().unwrap_or_else(|p| p.into_inner());
        st.busy = false;
        drop(st);
        self.0.cond.notify_all();
    }
}

impl Gate {
    pub(crate) fn turn(&self, class: u8) -> Turn<'_> {
        let c = class.min(CLASSES - 1) as usize;
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.waiting[c] += 1;
        while st.busy || st.more_urgent_waiting(c) {
            st = self.cond.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.waiting[c] -= 1;
        st.busy = true;
        Turn(self)
    }

    /// Whether any writer waits for a turn.
    pub(crate) fn others_waiting(&self) -> bool {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.waiting.iter().any(|&n| n > 0)
    }

    /// Writers of `class` waiting for a turn.
    pub(crate) fn waiting(&self, class: u8) -> u32 {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.waiting[class.min(CLASSES - 1) as usize]
    }
}

/// Chunks one turn may write together while no other writer waits: fewer
/// `writev`s and fewer wake-ups of the server per message, while an
/// urgent writer that comes meanwhile waits behind at most this many
/// (the send buffer holds as many, `BUFFERED_CHUNKS`).
const BATCH: usize = 4;

/// Writes `data` as chunks of `class` of at most `size` bytes; `write`
/// gets the chunks of one turn (headers, then a slice of `data`, each) and
/// writes them under the connection's writer lock. A turn takes one chunk,
/// or up to [`BATCH`] while no other writer waits. The data is written from
/// where it is: the calling thread sends every chunk of its message before
/// it returns, so borrowed memory needs no copy.
pub(crate) fn send(
    gate: &Gate,
    id: u32,
    class: u8,
    data: &[u8],
    size: u32,
    mut write: impl FnMut(&mut dyn Buf) -> io::Result<()>,
) -> io::Result<()> {
    let invalid = |e| io::Error::new(io::ErrorKind::InvalidInput, e);
    let size = (size as usize).max(1);
    let total = data.len() as u64;
    let mut at = 0;
    loop {
        let turn = gate.turn(class);
        let mut heads = Vec::with_capacity(BATCH);
        let mut spans = Vec::with_capacity(BATCH);
        loop {
            let n = size.min(data.len() - at);
            let head = ChunkHeader::at(id, class, at as u64, total, n as u64)
                .encode()
                .map_err(invalid)?;
            heads.push(head);
            spans.push(at..at + n);
            at += n;
            if at == data.len() || heads.len() == BATCH || gate.others_waiting() {
                break;
            }
        }
        let parts = heads
            .iter()
            .zip(&spans)
            .flat_map(|(h, r)| [&h[..], &data[r.clone()]]);
        write(&mut Gather::new(parts))?;
        drop(turn);
        if at == data.len() {
            return Ok(());
        }
    }
}

/// Byte slices written one after another as one buffer (one `writev`).
struct Gather<'a> {
    parts: Vec<&'a [u8]>,
    at: usize,
    off: usize,
}

impl<'a> Gather<'a> {
    fn new(parts: impl Iterator<Item = &'a [u8]>) -> Self {
        // No empty part: `chunk` must not be empty while bytes remain.
        Gather {
            parts: parts.filter(|p| !p.is_empty()).collect(),
            at: 0,
            off: 0,
        }
    }
}

impl Buf for Gather<'_> {
    fn remaining(&self) -> usize {
        self.parts[self.at..].iter().map(|p| p.len()).sum::<usize>() - self.off
    }

    fn chunk(&self) -> &[u8] {
        self.parts.get(self.at).map_or(&[], |p| &p[self.off..])
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let left = self.parts[self.at].len() - self.off;
            if n < left {
                self.off += n;
                return;
            }
            n -= left;
            self.at += 1;
            self.off = 0;
        }
    }

    fn chunks_vectored<'b>(&'b self, dst: &mut [io::IoSlice<'b>]) -> usize {
        let mut n = 0;
        for (i, p) in self.parts[self.at..].iter().enumerate() {
            if n == dst.len() {
                break;
            }
            let p = if i == 0 { &p[self.off..] } else { p };
            dst[n] = io::IoSlice::new(p);
            n += 1;
        }
        n
    }
}

/// Writes all of `b` with vectored writes.
pub(crate) fn write_buf<W: Write + ?Sized>(w: &mut W, b: &mut dyn Buf) -> io::Result<()> {
    while b.has_remaining() {
        let mut iov = [io::IoSlice::new(&[]); 2 * BATCH + 2];
        let n = b.chunks_vectored(&mut iov);
        match w.write_vectored(&iov[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => b.advance(k),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    w.flush()
}

/// Credits a message of the default class or a less urgent one leaves
/// unused with `chunks` agreed: a server grants a `chunks` user this many
/// beyond its nodes' windows for the urgent classes (0–3), so an urgent
/// message never waits for a bulk result before it may be sent.
pub(crate) const URGENT_RESERVE: u64 = 1;

pub(crate) fn kept_credit(chunk_size: Option<u32>, class: u8) -> u64 {
    if chunk_size.is_some() && class >= corefarm_smp::stream::DEFAULT_CLASS {
        URGENT_RESERVE
    } else {
        0
    }
}

/// Chunks the kernel may hold in the send buffer: an urgent chunk waits
/// behind at most these (the kernel's auto-tuned buffer holds megabytes,
/// which is what interleaving by class would otherwise wait behind).
pub(crate) const BUFFERED_CHUNKS: usize = 4;

/// Sizes the socket's send buffer to [`BUFFERED_CHUNKS`] chunks; a failure
/// only costs latency, so it is ignored.
pub(crate) fn shallow_send_buffer(sock: &std::net::TcpStream, chunk_size: u32) {
    let want = BUFFERED_CHUNKS * (chunk_size as usize + corefarm_smp::stream::CHUNK_HEADER_LEN + 8);
    let _ = socket2::SockRef::from(sock).set_send_buffer_size(want);
}

/// The reader's reassembly: results within `max_message`, at most
/// [`MAX_OPEN`] open, twice `max_message` held across them.
pub(crate) fn reassembler(max_message: u32) -> Reassembler {
    let max = u64::from(max_message);
    Reassembler::new(max, MAX_OPEN, 2 * max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};

    #[test]
    fn an_urgent_writer_gets_the_next_turn_ahead_of_bulk_waiters() {
        let gate = Arc::new(Gate::default());
        let held = gate.turn(7);
        let (tx, rx) = mpsc::channel();
        let spawn = |class: u8| {
            let (gate, tx) = (gate.clone(), tx.clone());
            std::thread::spawn(move || {
                let _t = gate.turn(class);
                tx.send(class).unwrap();
            })
        };
        let bulk = spawn(7);
        // Both wait (the gate counts them) before the turn ends.
        let wait_for = |n: u32| loop {
            let st = gate.st.lock().unwrap();
            if st.waiting.iter().sum::<u32>() == n {
                break;
            }
            drop(st);
            std::thread::yield_now();
        };
        wait_for(1);
        let urgent = spawn(0);
        wait_for(2);
        drop(held);
        assert_eq!(rx.recv().unwrap(), 0);
        assert_eq!(rx.recv().unwrap(), 7);
        bulk.join().unwrap();
        urgent.join().unwrap();
    }

    /// Chunks written from borrowed memory are byte for byte what the
    /// codec's chunker frames from a shared buffer, an empty message
    /// included.
    #[test]
    fn chunks_sent_from_a_slice_match_the_codecs_framing() {
        use corefarm_smp::stream::Chunks;
        let gate = Gate::default();
        for len in [0usize, 999, 1000, 2500] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut wire = Vec::new();
            send(&gate, 9, 2, &data, 1000, |f| {
                wire.extend_from_slice(&f.copy_to_bytes(f.remaining()));
                Ok(())
            })
            .unwrap();
            let mut want = Vec::new();
            for c in Chunks::new(9, 2, bytes::Bytes::from(data.clone()), 1000).unwrap() {
                let mut f = c.to_frame().unwrap();
                want.extend_from_slice(&f.copy_to_bytes(f.remaining()));
            }
            assert_eq!(wire, want, "{len} bytes");
        }
    }

    /// A turn takes up to `BATCH` chunks while nobody else waits.
    #[test]
    fn a_lone_writer_sends_its_chunks_in_batches() {
        let gate = Gate::default();
        let data = vec![5u8; 9 * 100];
        let mut writes = Vec::new();
        send(&gate, 1, 7, &data, 100, |f| {
            writes.push(f.remaining());
            f.advance(f.remaining());
            Ok(())
        })
        .unwrap();
        let chunk = 100 + corefarm_smp::HEADER_LEN + corefarm_smp::stream::CHUNK_HEADER_LEN;
        assert_eq!(writes, [4 * chunk, 4 * chunk, chunk]);
    }

    #[test]
    fn gather_advances_across_parts_and_lists_what_is_left() {
        let (a, b, c) = (&b"abc"[..], &b""[..], &b"defgh"[..]);
        let mut g = Gather::new([a, b, c].into_iter());
        assert_eq!(g.remaining(), 8);
        g.advance(2);
        assert_eq!(g.chunk(), b"c");
        let mut iov = [io::IoSlice::new(&[]); 4];
        assert_eq!(g.chunks_vectored(&mut iov), 2);
        assert_eq!((&*iov[0], &*iov[1]), (&b"c"[..], &b"defgh"[..]));
        g.advance(3);
        assert_eq!((g.remaining(), g.chunk()), (3, &b"fgh"[..]));
        assert_eq!(g.copy_to_bytes(3), &b"fgh"[..]);
        assert_eq!((g.remaining(), g.chunk()), (0, &b""[..]));
    }
}
