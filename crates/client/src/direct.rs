//! The direct data path: a group's data messages go straight to the
//! members' peer ports, so the server is not a hop on the bulk path, while
//! the server keeps the control plane (configuration through
//! [`Group::configure`], membership, failure detection). Each member runs its share on the group's cores.
//!
//! Exactly once: every input message has an id; a member whose connection
//! ends (it died) has its unanswered messages sent again to the others, and
//! a result is kept only the first time its id is answered.
//!
//! Plain TCP only: the members' peer ports do not speak TLS, so a group
//! opened over TLS ([`crate::group::GroupOptions::tls`]) has no direct path
//! ([`GroupError::DirectOverTls`]) rather than one that leaves the encryption.
//!
//! Classes: [`Direct::map_with`] gives a call's
//! messages a priority class, 0 (most urgent) to 7; [`Direct::map`] uses
//! the default class 4. A member that offers chunks in its hello answer
//! gets them as chunk frames (type 0x1D) carrying the class, and runs the
//! queued messages of all direct connections most urgent first (with the
//! node's anti-starvation guard); an old member gets whole data frames and
//! runs them in arrival order, as before. Results come back whole.
//!
//! ```no_run
//! # use corefarm_client::group::{Group, GroupOptions};
//! # let mut g = Group::open("127.0.0.1:9999", GroupOptions::new(4))?;
//! # let (cfg, inputs): (corefarm_smp::Configuration, Vec<bytes::Bytes>) = todo!();
//! g.configure(&cfg)?;
//! let mut d = g.direct(8)?;          // up to 8 messages in flight per member
//! let outputs = d.map(&inputs)?;     // in input order
//! # Ok::<(), corefarm_client::group::GroupError>(())
//! ```

use std::collections::{BTreeSet, VecDeque};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::group::DIRECT_USER;
use corefarm_smp::peer::{agree_chunks, hello_name, split_hello_name};
use corefarm_smp::stream::{Chunks, CLASSES, DEFAULT_CHUNK_SIZE, DEFAULT_CLASS};
use corefarm_smp::{Data, ErrorMsg, MsgType, OutFrame, PeerBody, PeerHeader, PeerKind, PeerMsg};

use crate::group::{Group, GroupError, Result};
use crate::ClientError;

/// Largest data message a member's peer port takes (its 1 MiB chunk frame).
pub const MAX_DIRECT_MESSAGE: usize = 1 << 20;

enum Event {
    Result(u32, Bytes),
    Failed(u32, String),
    Closed(String),
}

struct Link {
    rank: u32,
    label: String,
    writer: Option<TcpStream>,
    in_flight: BTreeSet<u32>,
    /// The agreed chunk size; 0: a member that predates chunks.
    chunk: u32,
}

/// Direct connections to every member of a group.
pub struct Direct {
    links: Vec<Link>,
    events: mpsc::Receiver<(usize, Event)>,
    window: usize,
    timeout: Duration,
    /// The wire id of the next call's first message: each call's ids follow
    /// the last call's, so an answer to a call that returned early (a
    /// timeout, a failed message) is never taken for one of a later call.
    next_id: u32,
}

impl Drop for Direct {
    fn drop(&mut self) {
        for l in &self.links {
            if let Some(w) = &l.writer {
                let _ = w.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

fn io(during: &'static str) -> impl Fn(std::io::Error) -> GroupError {
    move |source| ClientError::Io { during, source }.into()
}

impl Group {
    /// Opens a direct connection to every member; `window` data messages may
    /// be in flight per member. Chunks (and so classes) are offered with
    /// the default chunk size.
    pub fn direct(&self, window: usize) -> Result<Direct> {
        self.direct_with_chunks(window, DEFAULT_CHUNK_SIZE)
    }

    /// [`Group::direct`] offering chunks of `chunk_size` bytes; 0 offers
    /// none, as a client that predates them: whole frames, no classes.
    ///
    /// Refused with [`GroupError::DirectOverTls`] on a group opened over
    /// TLS: the members' peer ports speak plain TCP only.
    pub fn direct_with_chunks(&self, window: usize, chunk_size: u32) -> Result<Direct> {
        if self.tls {
            return Err(GroupError::DirectOverTls);
        }
        let (tx, events) = mpsc::channel();
        let mut links = Vec::new();
        match self.link_all(chunk_size, &tx, &mut links) {
            Ok(()) => Ok(Direct {
                links,
                events,
                window: window.max(1),
                timeout: self.timeout + Duration::from_secs(5),
                next_id: 0,
            }),
            Err(e) => {
                // The members linked so far: their reader threads end with
                // their connections.
                for l in &links {
                    if let Some(w) = &l.writer {
                        let _ = w.shutdown(std::net::Shutdown::Both);
                    }
                }
                Err(e)
            }
        }
    }

    /// Links every member in turn, pushing each onto `links`.
    fn link_all(
        &self,
        chunk_size: u32,
        tx: &mpsc::Sender<(usize, Event)>,
        links: &mut Vec<Link>,
    ) -> Result<()> {
        for m in self.members() {
            let addr: SocketAddr = m
                .peer
                .parse()
                .map_err(|e| GroupError::Usage(format!("peer address {:?}: {e}", m.peer)))?;
            let mut s = TcpStream::connect_timeout(&addr, self.timeout)
                .map_err(io("connecting to a member's peer port"))?;
            s.set_nodelay(true).map_err(io("configuring the socket"))?;
            // A member that stops reading (its cores stuck) fails the write
            // instead of holding the caller: its messages go to the others.
            s.set_write_timeout(Some(self.timeout + Duration::from_secs(5)))
                .map_err(io("configuring the socket"))?;
            let hello = PeerMsg {
                header: PeerHeader {
                    kind: PeerKind::Hello,
                    ttl: 0,
                    group: self.id(),
                    src: DIRECT_USER,
                    dst: m.rank,
                    seq: 0,
                },
                body: PeerBody::Hello {
                    token: self.token,
                    name: hello_name("user", chunk_size),
                },
            };
            let f = hello.to_frame().map_err(ClientError::Protocol)?;
            s.write_all(&f.to_vec())
                .map_err(io("sending the direct hello"))?;
            let rd = s.try_clone().map_err(io("configuring the socket"))?;
            rd.set_read_timeout(Some(self.timeout))
                .map_err(io("configuring the socket"))?;
            // Outputs may be larger than inputs: bounded like any server message.
            let mut reader = FrameReader::new(rd, corefarm_smp::DEFAULT_MAX_MESSAGE);
            let label = self.label(m.rank);
            let answer = match reader.read_frame() {
                Ok(Some(f)) if f.ty == MsgType::Peer => PeerMsg::parse(f.payload),
                other => Err(corefarm_smp::ProtocolError::BadPeer(format!("{other:?}"))),
            };
            let chunk = match answer {
                Ok(PeerMsg {
                    body: PeerBody::Hello { name, .. },
                    ..
                }) => agree_chunks(chunk_size, split_hello_name(&name).1),
                other => {
                    return Err(GroupError::Failed {
                        op: "direct connection".into(),
                        rank: Some(m.rank),
                        node: Some(label.clone()),
                        reason: format!("rank {} ({label}) did not accept it: {other:?}", m.rank),
                    })
                }
            };
            reader
                .get_ref()
                .set_read_timeout(None)
                .map_err(io("configuring the socket"))?;
            let (k, tx) = (links.len(), tx.clone());
            std::thread::Builder::new()
                .name(format!("direct-{}", m.rank))
                .spawn(move || read_loop(k, reader, tx))
                .map_err(io("starting a reader thread"))?;
            links.push(Link {
                rank: m.rank,
                label,
                writer: Some(s),
                in_flight: BTreeSet::new(),
                chunk,
            });
        }
        Ok(())
    }
}

fn read_loop(k: usize, mut r: FrameReader<TcpStream>, tx: mpsc::Sender<(usize, Event)>) {
    let ev = loop {
        let f = match r.read_frame() {
            Ok(Some(f)) => f,
            Ok(None) => break Event::Closed("closed the connection".into()),
            Err(e) => break Event::Closed(e.to_string()),
        };
        let ev = match f.ty {
            MsgType::Data => match Data::parse(f.payload) {
                Ok(d) => Event::Result(d.id, d.data),
                Err(e) => break Event::Closed(e.to_string()),
            },
            MsgType::Error => match ErrorMsg::parse(&f.payload) {
                Ok(e) if e.id != ErrorMsg::NO_ID => Event::Failed(e.id, e.to_string()),
                Ok(e) => break Event::Closed(e.to_string()),
                Err(e) => break Event::Closed(e.to_string()),
            },
            other => break Event::Closed(format!("sent a {} message", other.name())),
        };
        if tx.send((k, ev)).is_err() {
            return;
        }
    };
    let _ = tx.send((k, ev));
}

impl Direct {
    /// Members still connected.
    pub fn live(&self) -> usize {
        self.links.iter().filter(|l| l.writer.is_some()).count()
    }

    /// Members whose connection carries chunks, and so classes.
    pub fn chunked(&self) -> usize {
        self.links
            .iter()
            .filter(|l| l.writer.is_some() && l.chunk > 0)
            .count()
    }

    /// Sends every data message (whole inputs of the group's configuration,
    /// at most [`MAX_DIRECT_MESSAGE`] bytes) to the members and returns the
    /// outputs in input order, each exactly once, re-sending the messages of
    /// a member that is lost to the others. The default class (4).
    pub fn map(&mut self, inputs: &[Bytes]) -> Result<Vec<Bytes>> {
        self.map_with(inputs, DEFAULT_CLASS)
    }

    /// [`Direct::map`] in priority class `class`, 0 (most urgent) to 7:
    /// at every member, these messages run ahead of queued ones of less
    /// urgent classes from any direct connection (a member that predates
    /// chunks ignores the class).
    pub fn map_with(&mut self, inputs: &[Bytes], class: u8) -> Result<Vec<Bytes>> {
        if class >= CLASSES {
            return Err(GroupError::Usage(format!(
                "priority class {class}: 0 (most urgent) to {} exist",
                CLASSES - 1
            )));
        }
        if let Some(i) = inputs.iter().position(|d| d.len() > MAX_DIRECT_MESSAGE) {
            return Err(GroupError::Usage(format!(
                "input message {i} is over the direct path's {MAX_DIRECT_MESSAGE} bytes"
            )));
        }
        if inputs.len() > (u32::MAX / 2) as usize {
            return Err(GroupError::Usage(format!(
                "{} input messages in one call; at most {}",
                inputs.len(),
                u32::MAX / 2
            )));
        }
        // What an earlier call left in flight is answered, if ever, under
        // ids this call does not use: forgotten (the members' own queues
        // bound what they hold).
        for l in &mut self.links {
            l.in_flight.clear();
        }
        let base = self.next_id;
        self.next_id = base.wrapping_add(inputs.len() as u32);
        let mut out: Vec<Option<Bytes>> = vec![None; inputs.len()];
        let mut queue: VecDeque<u32> = (0..inputs.len() as u32).collect();
        let (mut done, mut lost) = (0, Vec::new());
        while done < inputs.len() {
            self.dispatch(&mut queue, inputs, base, class, &mut lost);
            if self.live() == 0 {
                return Err(GroupError::Failed {
                    op: "direct data".into(),
                    rank: None,
                    node: None,
                    reason: format!("every member is lost: {}", lost.join("; ")),
                });
            }
            let (k, ev) = match self.events.recv_timeout(self.timeout) {
                Ok(e) => e,
                Err(_) => {
                    let waiting: Vec<u32> = self
                        .links
                        .iter()
                        .filter(|l| !l.in_flight.is_empty())
                        .map(|l| l.rank)
                        .collect();
                    return Err(GroupError::Timeout {
                        op: "direct data".into(),
                        after: self.timeout,
                        nodes: waiting
                            .iter()
                            .map(|&r| self.links[r as usize].label.clone())
                            .collect::<Vec<_>>()
                            .join(", "),
                        waiting,
                    });
                }
            };
            match ev {
                Event::Result(id, data) => {
                    // Only an id this member was given in this call,
                    // answered for the first time.
                    let i = id.wrapping_sub(base) as usize;
                    if self.links[k].in_flight.remove(&id) && i < out.len() && out[i].is_none() {
                        out[i] = Some(data);
                        done += 1;
                    }
                }
                // An earlier call's message failing is not this call's.
                Event::Failed(id, _) if !self.links[k].in_flight.contains(&id) => {}
                Event::Failed(id, reason) => {
                    let l = &self.links[k];
                    let i = id.wrapping_sub(base);
                    return Err(GroupError::Failed {
                        op: format!("direct data message {i}"),
                        rank: Some(l.rank),
                        node: Some(l.label.clone()),
                        reason: format!("rank {} ({}): {reason}", l.rank, l.label),
                    });
                }
                Event::Closed(reason) => self.lose(k, &reason, base, &mut queue, &mut lost),
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every id answered"))
            .collect())
    }

    /// `queue` holds messages by index in the call; `base` is the wire id
    /// of index 0.
    fn lose(
        &mut self,
        k: usize,
        reason: &str,
        base: u32,
        queue: &mut VecDeque<u32>,
        lost: &mut Vec<String>,
    ) {
        let l = &mut self.links[k];
        if l.writer.take().is_none() {
            return;
        }
        lost.push(format!("rank {} ({}) {reason}", l.rank, l.label));
        // Its unanswered messages go to the others, first in line (in the
        // order they were sent, ids possibly wrapping past u32::MAX).
        let mut ids: Vec<u32> = std::mem::take(&mut l.in_flight)
            .into_iter()
            .map(|id| id.wrapping_sub(base))
            .collect();
        ids.sort_unstable();
        for i in ids.into_iter().rev() {
            queue.push_front(i);
        }
    }

    /// Fills every live member's window from the queue.
    fn dispatch(
        &mut self,
        queue: &mut VecDeque<u32>,
        inputs: &[Bytes],
        base: u32,
        class: u8,
        lost: &mut Vec<String>,
    ) {
        let mut progress = true;
        while progress && !queue.is_empty() {
            progress = false;
            for k in 0..self.links.len() {
                let l = &mut self.links[k];
                if l.writer.is_none() || l.in_flight.len() >= self.window {
                    continue;
                }
                let Some(i) = queue.pop_front() else { break };
                let (data, chunk) = (inputs[i as usize].clone(), l.chunk);
                let w = l.writer.as_mut().expect("live");
                let id = base.wrapping_add(i);
                match send(w, id, class, data, chunk) {
                    Ok(()) => {
                        l.in_flight.insert(id);
                        progress = true;
                    }
                    Err(e) => {
                        queue.push_front(i);
                        self.lose(k, &format!("write failed: {e}"), base, queue, lost);
                    }
                }
            }
        }
    }
}

/// Writes one message: whole to a member without chunks; with chunks, as
/// chunks of `class` unless it is a default-class message that fits one
/// chunk (whole, as on the user link: the member takes a whole frame as
/// the default class). A call's messages share one class and are written
/// one after the other, so there is nothing to interleave on one
/// connection; the member's queue orders connections' messages by class.
fn send(w: &mut TcpStream, id: u32, class: u8, data: Bytes, chunk: u32) -> std::io::Result<()> {
    if chunk == 0 || (class == DEFAULT_CLASS && data.len() <= chunk as usize) {
        let frame = OutFrame::data(id, data).expect("bounded size");
        return write_frame(w, frame);
    }
    let invalid = |e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    for c in Chunks::new(id, class, data, chunk as usize).map_err(invalid)? {
        let mut f = c.to_frame().map_err(invalid)?;
        crate::chunked::write_buf(w, &mut f)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
