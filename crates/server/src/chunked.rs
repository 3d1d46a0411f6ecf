//! Chunks on a user link (feature `chunks`): what a user session
//! needs to take data messages as chunks and to send results back as
//! chunks interleaved by priority class.
//!
//! - [`chunk_size`]: the size in force, from the user's hello.
//! - [`Inbound`]: reassembly of the user's chunks, bounded per connection.
//! - [`Outbound`]: results waiting to go out, cut into chunks on demand and
//!   picked by class, so an urgent result overtakes a bulk one mid-way.

use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use corefarm_smp::stream::{
    Chunk, ChunkHeader, Chunks, ClassQueues, Message, Place, Reassembler, CHUNK_HEADER_LEN,
    DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE,
};
use corefarm_smp::{Hello, OutFrame, ProtocolError, HEADER_LEN};

use crate::budget::Charge;

/// The largest chunk this server sends or accepts; a user that asks for no
/// size gets the default, one that asks for more gets at most this.
pub(crate) const SERVER_CHUNK_SIZE: u32 = MAX_CHUNK_SIZE;

/// Below this a chunk costs more in headers and wake-ups than it saves in
/// waiting: a user asking for less is not agreed `chunks` at all.
pub(crate) const MIN_CHUNK_SIZE: u32 = 512;

/// Messages a user may have begun and not finished at once: a client
/// interleaves a few classes, not hundreds of messages.
pub(crate) const MAX_OPEN: usize = 64;

/// Anti-starvation guard of the result queue: a bulk class still gets one
/// chunk in this many while more urgent classes saturate the link.
pub(crate) const GUARD: u32 = 16;

/// Chunks the kernel may hold in the user socket's buffers, each way: an
/// urgent chunk queues behind at most these, not behind the megabytes of
/// an auto-tuned buffer.
pub(crate) const BUFFERED_CHUNKS: usize = 4;

/// Why a result chunk could not be handed to the user's sink.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FeedError {
    #[error("cannot frame a result chunk: {0}")]
    Frame(ProtocolError),
    #[error("user connection closed")]
    Closed,
}

/// Shallow kernel buffers for a `chunks` user's socket; a failure only
/// costs latency.
pub(crate) fn shallow_buffers(sock: &socket2::SockRef<'_>, chunk_size: u32) {
    let want = BUFFERED_CHUNKS * (chunk_size as usize + CHUNK_HEADER_LEN + HEADER_LEN);
    let _ = sock.set_recv_buffer_size(want);
    let _ = sock.set_send_buffer_size(want);
}

/// Messages a `chunks` user under credit may have waiting in the server
/// for a node (read ahead of the nodes so they can be served by class).
pub(crate) const READ_AHEAD: usize = 64;

/// Messages of a class more urgent than the default that a `chunks` user
/// under credit may have beyond its nodes' windows, and that a node may
/// take beyond its own: without it bulk messages holding every credit and
/// every node slot made an urgent message wait for a bulk result (a 16 MiB
/// round trip) before it could even be sent (bench/manual/streams.md).
/// The client keeps this last credit for urgent classes.
pub(crate) const URGENT_RESERVE: u32 = 1;

/// Chunk frames queued in the user's sink ahead of the next pick: with
/// more, an urgent result waits behind that many bulk chunks.
pub(crate) const SINK_DEPTH: usize = 1;

/// The chunk size in force with a user that asked for `chunks`, or `None`
/// if what it asked for is too small to agree to.
pub(crate) fn chunk_size(user: &Hello) -> Option<u32> {
    let size = user
        .chunk_size
        .unwrap_or(DEFAULT_CHUNK_SIZE)
        .min(SERVER_CHUNK_SIZE);
    (size >= MIN_CHUNK_SIZE).then_some(size)
}

/// A peer's chunks put back together, read into place (`Place`), and
/// what they hold charged to the server's memory budget. What a user can
/// make the server hold is bounded by `--max-message` per message,
/// [`MAX_OPEN`] messages, and twice `--max-message` across them (a bulk
/// message near the limit plus urgent ones interleaved with it), and by
/// what is left of `--memory-budget`; a chunk over the size agreed in the
/// hello is refused.
///
/// Each unfinished message's age is kept on the connection's reading
/// clock (time the server waited to read from the peer: see
/// `UserConn::read`), so a message is timed out only for the peer's
/// silence, never while the server held the peer back.
pub(crate) struct Inbound {
    r: Reassembler,
    charge: Option<Charge>,
    /// A user's message buffer is its whole length from its first chunk
    /// (`Reassembler::reserve_whole`): charged before it is reserved.
    reserves: bool,
    /// Unfinished messages, by id: when each was begun, on the reading clock.
    begun: HashMap<u32, Duration>,
    /// The reading clock when the current read began, and when that was.
    stamp: (Duration, Instant),
    /// How long a message may stay unfinished, on the reading clock.
    timeout: Option<Duration>,
}

pub(crate) fn inbound(chunk_size: u32, max_message: u32) -> Inbound {
    // The data of a message excludes its 4-byte id, as in type 3.
    let max_data = u64::from(max_message).saturating_sub(corefarm_smp::DATA_ID_LEN as u64);
    let r = Reassembler::new(max_data, MAX_OPEN, 2 * u64::from(max_message))
        .reserve_whole()
        .chunk_limit(u64::from(chunk_size));
    Inbound::new(r, true)
}

impl Inbound {
    /// Chunks reassembled by `r`; `reserves` if it reserves a message's
    /// whole length at its first chunk.
    pub(crate) fn new(r: Reassembler, reserves: bool) -> Self {
        Inbound {
            r,
            charge: None,
            reserves,
            begun: HashMap::new(),
            stamp: (Duration::ZERO, Instant::now()),
            timeout: None,
        }
    }

    /// A message unfinished for `t` of the reading clock is overdue
    /// ([`Inbound::due`]).
    pub(crate) fn timed(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// With the reading clock at `reading`: the unfinished message begun
    /// first, and how much more reading it has to be finished in.
    pub(crate) fn due(&self, reading: Duration) -> Option<(u32, Duration)> {
        let t = self.timeout?;
        let (id, begun) = self.oldest()?;
        Some((id, (begun + t).saturating_sub(reading)))
    }

    /// What the messages hold is charged to `c` (a server's budget).
    pub(crate) fn charged(mut self, c: Charge) -> Self {
        self.charge = Some(c);
        self
    }

    /// Messages begun and not finished.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.r.open()
    }

    /// A read begins with the reading clock at `reading`.
    pub(crate) fn stamp(&mut self, reading: Duration) {
        self.stamp = (reading, Instant::now());
    }

    /// The unfinished message begun first: its id, and when it was begun
    /// on the reading clock.
    pub(crate) fn oldest(&self) -> Option<(u32, Duration)> {
        self.begun
            .iter()
            .min_by_key(|&(&id, &at)| (at, id))
            .map(|(&id, &at)| (id, at))
    }

    fn now(&self) -> Duration {
        self.stamp.0 + self.stamp.1.elapsed()
    }

    /// The charge follows what the reassembler holds (`extra` more, about
    /// to be reserved).
    fn sync(&mut self, extra: u64) -> Result<(), ProtocolError> {
        if let Some(c) = &mut self.charge {
            c.set(self.r.held() + extra)?;
        }
        Ok(())
    }

    /// Before message `h` is opened: a whole-length reservation is charged
    /// before it is made.
    fn opening(&mut self, h: &ChunkHeader) -> Result<(), ProtocolError> {
        if self.reserves {
            self.sync(h.total.max(h.len))?;
        }
        Ok(())
    }

    fn opened(&mut self, id: u32) -> Result<(), ProtocolError> {
        let at = self.now();
        self.begun.insert(id, at);
        self.sync(0)
    }

    /// Takes a chunk read as a frame; returns the message it completes.
    pub(crate) fn push(&mut self, c: Chunk) -> Result<Option<Message>, ProtocolError> {
        let (id, opens) = (c.head.id, c.head.first && !c.head.last);
        if opens {
            self.opening(&c.header())?;
        }
        let whole = self.r.push(c)?;
        if opens {
            self.opened(id)?;
        } else if whole.is_some() {
            self.begun.remove(&id);
        }
        self.sync(0)?;
        Ok(whole)
    }
}

// SAFETY: every buffer handed out is the reassembler's own, as it hands it
// out (`resume` returns the buffer `begin` or `place` just returned), so
// its guarantees hold unchanged.
unsafe impl Place for Inbound {
    type Whole = Message;

    fn begin(&mut self, h: &ChunkHeader) -> Result<Option<&mut Vec<u8>>, ProtocolError> {
        if h.last {
            return Ok(None);
        }
        self.opening(h)?;
        if self.r.begin(h)?.is_none() {
            return Ok(None);
        }
        self.opened(h.id)?;
        Ok(self.r.resume(h.id))
    }

    fn place(&mut self, h: &ChunkHeader) -> Result<Option<&mut Vec<u8>>, ProtocolError> {
        if self.r.place(h)?.is_none() {
            return Ok(None);
        }
        self.sync(0)?;
        Ok(self.r.resume(h.id))
    }

    fn resume(&mut self, id: u32) -> Option<&mut Vec<u8>> {
        self.r.resume(id)
    }

    fn placed(&mut self, h: &ChunkHeader) -> Option<Message> {
        let whole = self.r.placed(h);
        if whole.is_some() {
            self.begun.remove(&h.id);
            // What was held goes back: a release is never refused.
            let _ = self.sync(0);
        }
        whole
    }
}

/// Wire bytes of a placed chunk, for the link counters.
pub(crate) fn wire_len(c: &ChunkHeader) -> usize {
    HEADER_LEN + CHUNK_HEADER_LEN + c.len as usize
}

/// Results to a `chunks` user, by class. Each waits as its remaining
/// chunks; a pick takes one chunk and puts the rest back at the end of its
/// class, so results of one class share the link chunk by chunk.
pub(crate) struct Outbound {
    q: ClassQueues<Chunks>,
    chunk_size: usize,
}

impl Outbound {
    pub(crate) fn new(chunk_size: u32) -> Self {
        Outbound {
            q: ClassQueues::new(GUARD),
            chunk_size: chunk_size as usize,
        }
    }

    /// Queues a result; a class out of range is refused by the codec.
    pub(crate) fn push(&mut self, id: u32, class: u8, data: Bytes) -> Result<(), ProtocolError> {
        let chunks = Chunks::new(id, class, data, self.chunk_size)?;
        self.q.push(class, chunks);
        Ok(())
    }

    /// Results not completely handed to the sink.
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// The next chunk to write, by class.
    #[cfg(test)]
    pub(crate) fn next_frame(&mut self) -> Option<Result<OutFrame, ProtocolError>> {
        self.next_with_class().map(|(_, f)| f)
    }

    /// Hands the most urgent waiting chunk to the user's sink in its class,
    /// so an urgent result is written at once rather than when the session
    /// next runs out of work. Err if the chunk cannot be framed or the
    /// connection is gone.
    pub(crate) fn feed(
        &mut self,
        sink: &crate::sink::Sink,
        metrics: &crate::metrics::LinkCounters,
    ) -> Result<(), FeedError> {
        let Some((class, next)) = self.next_with_class() else {
            return Ok(());
        };
        let f = next.map_err(FeedError::Frame)?;
        metrics.sent(f.wire_len());
        if sink.push_class(f, class, false) {
            Ok(())
        } else {
            Err(FeedError::Closed)
        }
    }

    /// The next chunk to write, by class, with its class, for a sink that
    /// writes urgent frames at once ([`crate::sink::Sink::push_class`]).
    pub(crate) fn next_with_class(&mut self) -> Option<(u8, Result<OutFrame, ProtocolError>)> {
        let (class, mut rest) = self.q.pop()?;
        let c = rest.next()?;
        if !c.head.last {
            self.q.push(class, rest);
        }
        Some((class, out_frame(&c)))
    }
}

/// A chunk as the user's sink carries it: a chunk frame is an `OutFrame`
/// (its inline head holds the chunk header), so the data is not copied.
pub(crate) fn out_frame(c: &Chunk) -> Result<OutFrame, ProtocolError> {
    c.to_frame()
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_smp::codec::{FrameReader, Read};

    fn parse_out(f: OutFrame) -> Chunk {
        let v = f.to_vec();
        assert_eq!(v[0], corefarm_smp::MsgType::Chunk as u8);
        Chunk::parse(Bytes::from(v).slice(HEADER_LEN..)).unwrap()
    }

    #[test]
    fn the_size_in_force_is_the_smaller_and_too_small_is_refused() {
        let mut h = Hello::new("user");
        assert_eq!(chunk_size(&h), Some(DEFAULT_CHUNK_SIZE));
        h.chunk_size = Some(4096);
        assert_eq!(chunk_size(&h), Some(4096));
        h.chunk_size = Some(u32::MAX);
        assert_eq!(chunk_size(&h), Some(SERVER_CHUNK_SIZE));
        h.chunk_size = Some(MIN_CHUNK_SIZE - 1);
        assert_eq!(chunk_size(&h), None);
    }

    #[test]
    fn an_urgent_result_overtakes_a_bulk_one_between_its_chunks() {
        let mut o = Outbound::new(1000);
        o.push(1, 7, Bytes::from(vec![7u8; 5000])).unwrap();
        let first = parse_out(o.next_frame().unwrap().unwrap());
        assert_eq!((first.head.id, first.head.offset), (1, 0));
        o.push(2, 0, Bytes::from(vec![0u8; 1500])).unwrap();
        let order: Vec<(u32, u64)> = std::iter::from_fn(|| o.next_frame())
            .map(|f| parse_out(f.unwrap()))
            .map(|c| (c.head.id, c.head.offset))
            .collect();
        assert_eq!(
            order,
            [
                (2, 0),
                (2, 1000),
                (1, 1000),
                (1, 2000),
                (1, 3000),
                (1, 4000)
            ]
        );
        assert!(o.is_empty());
        assert!(o.push(3, 8, Bytes::new()).is_err());
    }

    #[test]
    fn inbound_refuses_chunks_over_the_agreed_size() {
        let mut i = inbound(512, 1 << 20);
        let c = Chunks::new(5, 2, Bytes::from(vec![1u8; 600]), 600)
            .unwrap()
            .next()
            .unwrap();
        let payload = Bytes::from(c.to_frame().unwrap().to_vec()).slice(HEADER_LEN..);
        let e = i.push(Chunk::parse(payload).unwrap()).unwrap_err();
        assert!(e.to_string().contains("over the 512 agreed"), "{e}");
        let ok: Vec<Chunk> = Chunks::new(6, 2, Bytes::from(vec![1u8; 600]), 512)
            .unwrap()
            .collect();
        let mut got = None;
        for c in ok {
            let p = Bytes::from(c.to_frame().unwrap().to_vec()).slice(HEADER_LEN..);
            got = i.push(Chunk::parse(p).unwrap()).unwrap();
        }
        let m = got.expect("whole message");
        assert_eq!((m.id, m.class, m.data.len(), i.open()), (6, 2, 600, 0));
    }

    /// A user's chunks are read into the message's buffer, the first
    /// opening it; one over the agreed size is refused there as by `push`.
    #[tokio::test]
    async fn placed_chunks_come_out_whole_and_over_the_agreed_size_are_refused() {
        let data = Bytes::from((0..5000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let wire = |cs: &[Chunk]| -> Vec<u8> {
            cs.iter()
                .flat_map(|c| c.to_frame().unwrap().to_vec())
                .collect()
        };
        let cs: Vec<Chunk> = Chunks::new(6, 3, data.clone(), 512).unwrap().collect();
        let stream = wire(&cs);
        let mut r = FrameReader::new(&stream[..], 1 << 20);
        let mut i = inbound(512, 1 << 20);
        let (mut placed, mut got) = (0, None);
        while let Some(read) = r.read_with(Some(&mut i)).await.unwrap() {
            match read {
                Read::Frame(f) => {
                    assert!(i.push(Chunk::parse(f.payload).unwrap()).unwrap().is_none())
                }
                Read::Placed { chunk, whole } => {
                    placed += 1;
                    assert!(wire_len(&chunk) <= HEADER_LEN + CHUNK_HEADER_LEN + 512);
                    got = whole;
                }
            }
        }
        let m = got.expect("whole message");
        assert_eq!((m.id, m.class, m.data, i.open()), (6, 3, data.clone(), 0));
        assert_eq!(
            placed,
            cs.len(),
            "every chunk, the first opening the message"
        );

        let mut big = Chunks::new(7, 3, data.clone(), 512).unwrap();
        let mut cs = vec![big.next().unwrap()];
        cs.push(Chunk {
            data: data.slice(512..1112),
            ..big.next().unwrap()
        });
        let stream = wire(&cs);
        let mut r = FrameReader::new(&stream[..], 1 << 20);
        let mut i = inbound(512, 1 << 20);
        let first = r.read_with(Some(&mut i)).await.unwrap();
        assert!(matches!(first, Some(Read::Placed { whole: None, .. })));
        let e = r.read_with(Some(&mut i)).await.unwrap_err();
        assert!(
            e.to_string()
                .contains("a chunk of 600 bytes, over the 512 agreed"),
            "{e}"
        );
        // A first chunk over the size, refused before anything is held.
        let stream = wire(&cs[1..]);
        let over = Chunk::new(8, 3, 0, 5000, data.slice(..600));
        let stream = [wire(&[over]), stream].concat();
        let mut r = FrameReader::new(&stream[..], 1 << 20);
        let mut i = inbound(512, 1 << 20);
        let e = r.read_with(Some(&mut i)).await.unwrap_err();
        assert!(e.to_string().contains("a chunk of 600 bytes"), "{e}");
        assert_eq!(i.open(), 0);
    }
}
