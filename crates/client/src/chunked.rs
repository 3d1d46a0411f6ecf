//! Chunks on the client's link (issue 11, feature `chunks`).
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

use bytes::{Buf, Bytes};
use corefarm_smp::stream::{Chunks, Reassembler, CLASSES};

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

    /// Writers of `class` waiting for a turn.
    pub(crate) fn waiting(&self, class: u8) -> u32 {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.waiting[class.min(CLASSES - 1) as usize]
    }
}

/// Writes `data` as chunks of `class`, one turn per chunk; `write` gets
/// each encoded chunk and writes it under the connection's writer lock.
pub(crate) fn send(
    gate: &Gate,
    id: u32,
    class: u8,
    data: Bytes,
    size: u32,
    mut write: impl FnMut(&mut dyn Buf) -> io::Result<()>,
) -> io::Result<()> {
    let chunks = Chunks::new(id, class, data, size as usize)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    for c in chunks {
        let mut f = c
            .to_frame()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let _turn = gate.turn(class);
        write(&mut f)?;
    }
    Ok(())
}

/// Writes all of `b` with vectored writes.
pub(crate) fn write_buf<W: Write + ?Sized>(w: &mut W, b: &mut dyn Buf) -> io::Result<()> {
    while b.has_remaining() {
        let mut iov = [io::IoSlice::new(&[]); 4];
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
}
