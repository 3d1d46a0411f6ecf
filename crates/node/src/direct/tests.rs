//! A member's direct connections over real sockets, this test playing the
//! group's serve loop: negotiation, chunks by class, the queue's order,
//! an old-style user, and users that break the rules.

use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::group::DIRECT_USER;
use corefarm_smp::stream::{Chunk, Chunks, DEFAULT_CLASS};
use corefarm_smp::{ErrorMsg, MsgType, OutFrame, PeerBody, PeerMsg};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::queue::{queue, Submit, Take};
use super::{accept, Member, MAX_MESSAGE};
use crate::peer::{link, PeerListener};

const GROUP: u32 = 7;
const TOKEN: u64 = 0x5eed;
const RANK: u32 = 0;
const LIMIT: Duration = Duration::from_secs(10);
const OFFER: u32 = 4096;

struct User {
    rd: FrameReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    /// The chunk size the member's answer offered.
    offered: u32,
}

/// A direct user connected to a member served by `jobs`; `offer` 0 is a
/// user that predates chunks.
async fn connect(l: &PeerListener, jobs: &Submit, offer: u32) -> User {
    let (mut inc, _guard) = l.register(GROUP).unwrap();
    let s = TcpStream::connect(l.local_addr()).await.unwrap();
    let (rd, mut wr) = s.into_split();
    let hello = link::hello(GROUP, DIRECT_USER, RANK, TOKEN, "user", offer);
    wr.write_all(&hello.to_frame().unwrap().to_vec())
        .await
        .unwrap();
    let inc = tokio::time::timeout(LIMIT, inc.recv())
        .await
        .unwrap()
        .unwrap();
    let member = Member {
        group: GROUP,
        rank: RANK,
        token: TOKEN,
        offer: OFFER,
        max_frame: l.max_frame(),
        jobs: jobs.clone(),
        stats: None,
        port: l.stats().clone(),
    };
    tokio::spawn(accept(inc, member));
    let mut rd = FrameReader::new(rd, 1 << 21);
    let f = rd.read_frame().await.unwrap().unwrap();
    assert_eq!(f.ty, MsgType::Peer);
    let PeerBody::Hello { name, .. } = PeerMsg::parse(f.payload).unwrap().body else {
        panic!("not a hello")
    };
    if offer == 0 {
        assert_eq!(name, "rank 0", "an old user's answer is unchanged");
    }
    let (_, offered) = link::split_name(&name);
    User { rd, wr, offered }
}

impl User {
    async fn chunks(&mut self, id: u32, class: u8, data: &[u8], size: usize) {
        for c in Chunks::new(id, class, Bytes::copy_from_slice(data), size).unwrap() {
            let mut f = c.to_frame().unwrap();
            self.wr.write_all_buf(&mut f).await.unwrap();
        }
    }

    async fn whole(&mut self, id: u32, data: &[u8]) {
        let f = OutFrame::data(id, Bytes::copy_from_slice(data)).unwrap();
        write_frame(&mut self.wr, f).await.unwrap();
    }

    /// The error without an id that ends a connection, then its end.
    async fn cut_off(&mut self) -> String {
        let f = tokio::time::timeout(LIMIT, self.rd.read_frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(f.ty, MsgType::Error);
        let e = ErrorMsg::parse(&f.payload).unwrap();
        assert_eq!(e.id, ErrorMsg::NO_ID);
        let end = tokio::time::timeout(LIMIT, self.rd.read_frame())
            .await
            .unwrap();
        assert!(matches!(end, Ok(None)), "closed after the error: {end:?}");
        e.to_string()
    }
}

/// Waits (on the queue, not a clock) until `n` messages are queued.
async fn queued(take: &Take, n: usize) {
    tokio::time::timeout(LIMIT, async {
        while take.len() < n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("messages queued");
}

async fn listener() -> PeerListener {
    PeerListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn an_urgent_message_runs_before_queued_bulk_ones_and_an_old_user_is_served() {
    let l = listener().await;
    let (jobs, mut take) = queue();
    let mut bulk = connect(&l, &jobs, 1024).await;
    assert_eq!(bulk.offered, OFFER, "the member offers chunks back");
    let mut old = connect(&l, &jobs, 0).await;
    assert_eq!(old.offered, 0);
    // Bulk messages of several chunks each (the smaller offer, 1024, is
    // the connection's size), an old user's whole message, then an urgent
    // one from the bulk user itself, all queued while "the cores" are busy.
    for id in 0..5 {
        bulk.chunks(id, 7, &[id as u8; 3000], 1024).await;
    }
    old.whole(50, b"old").await;
    bulk.chunks(9, 0, b"urgent", 1024).await;
    queued(&take, 7).await;
    let mut order = Vec::new();
    while take.len() > 0 {
        let j = take.next().await.unwrap();
        order.push((j.id, j.class, j.data.len()));
    }
    assert_eq!(
        order,
        [
            (9, 0, 6),
            (50, DEFAULT_CLASS, 3),
            (0, 7, 3000),
            (1, 7, 3000),
            (2, 7, 3000),
            (3, 7, 3000),
            (4, 7, 3000)
        ]
    );
}

#[tokio::test]
async fn users_that_break_the_rules_get_an_error_and_are_cut_off() {
    let l = listener().await;
    let (jobs, take) = queue();
    // A chunk on a connection that did not agree to chunks.
    let mut old = connect(&l, &jobs, 0).await;
    old.chunks(1, 0, b"x", 1024).await;
    assert!(old.cut_off().await.contains("did not agree"));
    // A chunk over the agreed size.
    let mut u = connect(&l, &jobs, 1024).await;
    u.chunks(1, 0, &[0; 2000], 2000).await;
    assert!(u
        .cut_off()
        .await
        .contains("a chunk of 2000 bytes, over the 1024 agreed"));
    // A message announced over the direct path's limit.
    let mut u = connect(&l, &jobs, 1024).await;
    let c = Chunk::new(1, 0, 0, MAX_MESSAGE + 1, Bytes::from_static(b"x"));
    u.wr.write_all_buf(&mut c.to_frame().unwrap())
        .await
        .unwrap();
    assert!(u.cut_off().await.contains("exceeds the limit"));
    // More messages open than classes.
    let mut u = connect(&l, &jobs, 1024).await;
    for id in 0..=super::MAX_OPEN as u32 {
        let c = Chunk::new(id, 0, 0, 10, Bytes::from_static(b"x"));
        u.wr.write_all_buf(&mut c.to_frame().unwrap())
            .await
            .unwrap();
    }
    let why = u.cut_off().await;
    assert!(why.contains("open") || why.contains("at once"), "{why}");
    // A chunk of a message never begun.
    let mut u = connect(&l, &jobs, 1024).await;
    let c = Chunk::new(1, 0, 1, 2, Bytes::from_static(b"x"));
    u.wr.write_all_buf(&mut c.to_frame().unwrap())
        .await
        .unwrap();
    u.cut_off().await;
    assert_eq!(take.len(), 0, "nothing of theirs was queued");
}

#[tokio::test]
async fn a_user_that_does_not_read_its_answers_is_no_longer_read() {
    use super::MAX_UNWRITTEN;
    let l = listener().await;
    let (jobs, mut take) = queue();
    let mut user = connect(&l, &jobs, 0).await;
    let n = MAX_UNWRITTEN + 8;
    for id in 0..n as u32 {
        user.whole(id, b"x").await;
    }
    // "The cores" take every message that comes and keep its answer
    // unwritten (held): the member reads no more than its bound.
    let mut held = Vec::new();
    while held.len() < MAX_UNWRITTEN {
        held.push(
            tokio::time::timeout(LIMIT, take.next())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // The rest is in the member's socket already: a member that read on
    // would queue the next at once. (A short wait can only miss such a
    // member on a stalled machine, never fail a correct one.)
    let more = tokio::time::timeout(Duration::from_millis(300), take.next()).await;
    assert!(more.is_err(), "read past {MAX_UNWRITTEN} unwritten answers");
    // Each answer written frees a place for one more message.
    let j = held.remove(0);
    let _ = j
        .reply
        .send((OutFrame::data(j.id, Bytes::new()).unwrap(), Some(j.slot)));
    let next = tokio::time::timeout(LIMIT, take.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.id, MAX_UNWRITTEN as u32);
    let f = tokio::time::timeout(LIMIT, user.rd.read_frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(f.ty, MsgType::Data);
}

/// A direct user's hello reaches the member while strangers hold far more
/// silent connections to its peer port than it has places for (before,
/// the user's connection waited in the kernel's backlog until strangers'
/// places came free, ten seconds each). Real sockets: the bound only
/// tells "answered" from "kept waiting behind the strangers".
#[tokio::test]
async fn a_direct_user_gets_through_a_port_full_of_silent_strangers() {
    let l = listener().await;
    let mut strangers = Vec::new();
    for _ in 0..200 {
        strangers.push(TcpStream::connect(l.local_addr()).await.unwrap());
    }
    let (mut inc, _guard) = l.register(GROUP).unwrap();
    let s = TcpStream::connect(l.local_addr()).await.unwrap();
    let (_rd, mut wr) = s.into_split();
    let hello = link::hello(GROUP, DIRECT_USER, RANK, TOKEN, "user", 0);
    wr.write_all(&hello.to_frame().unwrap().to_vec())
        .await
        .unwrap();
    let inc = tokio::time::timeout(Duration::from_secs(5), inc.recv()).await;
    let inc = inc.expect("the user's hello was read").unwrap();
    assert_eq!((inc.hello.src, inc.hello.dst), (DIRECT_USER, RANK));
    let s = l.stats();
    assert!(
        s.refused(crate::peer::Refusal::Evicted) > 0,
        "{:?}",
        s.all()
    );
    drop(strangers);
}
