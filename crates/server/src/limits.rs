//! Connections beyond `--max-users` / `--max-nodes` are refused with a
//! reason the peer can read, then closed.
//!
//! The refusal itself must not become a resource a peer can hold: only a
//! bounded number of refusals are answered at once (the rest are closed
//! straight away), each within a short deadline, reading at most a header and
//! a small hello.
//!
//! A connection still in its TLS handshake or authentication holds a place
//! too, but at most a quarter of a port's places (64 at most) may be held
//! that way, and the way in must be complete within one `--read-timeout`:
//! peers without a secret can neither take every place nor keep one.
//!
//! At the user port a full port takes a place back before it refuses
//! ([`Places`]): a connection that holds a place and nothing else (on its
//! way in, silent, or said hello and never configured) gives it to the new
//! one, the idlest first; a configured user never does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corefarm_smp::{
    hello::features, ConfigurationResponse, ErrorCode, ErrorMsg, Header, Hello, MsgType, HEADER_LEN,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ServerState;

/// Refusals answered at the same time; more are just closed.
const CONCURRENT: usize = 64;
/// Largest hello a refused peer may send (a hello is a few hundred bytes).
const MAX_HELLO: u32 = 64 * 1024;
/// Upper bound on the time spent answering one refused peer.
const MAX_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Port {
    Users,
    Nodes,
}

pub(crate) struct Refusals {
    slots: Arc<Semaphore>,
    max_users: usize,
    max_nodes: usize,
    wait: Duration,
}

impl Refusals {
    pub fn new(shared: &ServerState) -> Self {
        Refusals {
            slots: Arc::new(Semaphore::new(CONCURRENT)),
            max_users: shared.opts.max_users,
            max_nodes: shared.opts.max_nodes,
            wait: shared.opts.read_timeout.min(MAX_WAIT),
        }
    }

    /// Refuses one connection; returns at once (the answer is a task).
    pub fn refuse(&self, port: Port, stream: TcpStream, addr: SocketAddr) {
        let reason = reason(port, self.max_users, self.max_nodes);
        self.refuse_because(port, stream, addr, reason);
    }

    /// Refused because `cap` connections of the port are still on their way
    /// in (TLS handshake, authentication).
    pub fn refuse_opening(&self, port: Port, stream: TcpStream, addr: SocketAddr, cap: usize) {
        let reason = format!(
            "the server has {cap} connection(s) of this port still in their TLS handshake \
             or authentication, its limit for those; try again later"
        );
        self.refuse_because(port, stream, addr, reason);
    }

    fn refuse_because(&self, port: Port, stream: TcpStream, addr: SocketAddr, reason: String) {
        tracing::warn!(peer = %addr, "connection refused: {reason}");
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            return; // dropping the stream closes it
        };
        let wait = self.wait;
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(wait, answer(port, stream, reason)).await;
        });
    }
}

/// A connection on its way in for this share of `--read-timeout` has
/// stalled (a TLS handshake and the challenge take a few round trips):
/// at the opening cap it gives its place to a new connection.
const STALLED_SHARE: u32 = 10;

/// What holds a place: may it be taken back?
const IDLE: u8 = 0;
/// Configured, configuring, or a group user: never taken back.
const HELD: u8 = 1;
/// Taken back by a new connection: the holder is closing.
const EVICTED: u8 = 2;

/// The user port's `--max-users` places, and the share of them that
/// connections on their way in (TLS, authentication) may hold.
///
/// When every place is taken, a new connection takes the place of the
/// idlest connection that holds a place and nothing else: one on its way
/// in, one that has sent nothing, or one that is not configured (a hello
/// and maybe status requests). Which holder is idlest is read from its
/// [`Place`]'s atomics, so the session writes no lock to stay eligible or
/// to leave. Only when none is left is the new one refused. At the opening
/// cap, a connection that has been on its way in for a tenth of
/// `--read-timeout` gives its place to the new one; younger ones do not, so
/// that a burst of legitimate handshakes is refused rather than churned.
pub(crate) struct Places {
    table: Mutex<Table>,
    max: usize,
    opening_cap: usize,
    stalled_after: Duration,
    /// Times are kept as milliseconds since this (one atomic each).
    base: Instant,
}

#[derive(Default)]
struct Table {
    next: u64,
    held: HashMap<u64, Holder>,
    opening: usize,
}

struct Holder {
    state: Arc<PlaceState>,
    /// Still on its way in (counts toward the opening cap).
    opening: bool,
}

#[derive(Debug)]
struct PlaceState {
    stage: AtomicU8,
    /// Last message from the holder, milliseconds since [`Places::base`].
    active: AtomicU64,
    since: Instant,
    evict: CancellationToken,
}

/// Why a new connection was not given a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// Every place is held by a connection that may not be taken back.
    Places,
    /// This many are on their way in, none of them stalled.
    Opening(usize),
}

impl Places {
    pub fn new(max: usize, opening_cap: usize, read_timeout: Duration) -> Arc<Places> {
        Arc::new(Places {
            table: Mutex::default(),
            max,
            opening_cap,
            stalled_after: read_timeout / STALLED_SHARE,
            base: Instant::now(),
        })
    }

    fn ms(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_millis() as u64
    }

    /// A place for a new connection (`opening`: it has a TLS handshake or
    /// authentication to go through first), taken back from another if
    /// need be; that one's [`Place::evicted`] fires.
    pub fn admit(self: &Arc<Self>, opening: bool) -> Result<Place, Full> {
        let now = Instant::now();
        let victim = {
            let mut t = self.table.lock().expect("places lock");
            let mut victim = None;
            if opening && t.opening >= self.opening_cap {
                let (now, stalled) = (self.ms(now), self.stalled_after.as_millis() as u64);
                victim =
                    t.take_back(|h, active| h.opening && now.saturating_sub(active) >= stalled);
                if victim.is_none() {
                    return Err(Full::Opening(self.opening_cap));
                }
            }
            if t.held.len() >= self.max {
                victim = t.take_back(|_, _| true);
                if victim.is_none() {
                    return Err(Full::Places);
                }
            }
            t.next += 1;
            let id = t.next;
            let state = Arc::new(PlaceState {
                stage: AtomicU8::new(IDLE),
                active: AtomicU64::new(self.ms(now)),
                since: now,
                evict: CancellationToken::new(),
            });
            t.held.insert(
                id,
                Holder {
                    state: state.clone(),
                    opening,
                },
            );
            t.opening += usize::from(opening);
            (
                victim,
                Place {
                    id,
                    state,
                    places: self.clone(),
                },
            )
        };
        let (victim, place) = victim;
        if let Some(v) = victim {
            v.evict.cancel();
        }
        Ok(place)
    }

    /// Connections holding a place now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.table.lock().expect("places lock").held.len()
    }
}

impl Table {
    /// The idlest holder `eligible` admits whose place may be taken back,
    /// marked evicted and removed (its place is the new connection's).
    fn take_back(&mut self, eligible: impl Fn(&Holder, u64) -> bool) -> Option<Arc<PlaceState>> {
        loop {
            let (&id, h) = self
                .held
                .iter()
                .filter(|(_, h)| h.state.stage.load(Ordering::Acquire) == IDLE)
                .map(|(id, h)| (id, h, h.state.active.load(Ordering::Relaxed)))
                .filter(|(_, h, active)| eligible(h, *active))
                .min_by_key(|(id, _, active)| (*active, **id))
                .map(|(id, h, _)| (id, h))?;
            // Lost to the holder becoming configured in the meantime: the
            // next idlest, then.
            let won = h
                .state
                .stage
                .compare_exchange(IDLE, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if won {
                let h = self.held.remove(&id).expect("found");
                self.opening -= usize::from(h.opening);
                return Some(h.state);
            }
        }
    }
}

/// One connection's place; given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    id: u64,
    state: Arc<PlaceState>,
    places: Arc<Places>,
}

impl std::fmt::Debug for Places {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Places").field("max", &self.max).finish()
    }
}

impl Place {
    /// When the connection was accepted.
    pub fn since(&self) -> Instant {
        self.state.since
    }

    /// Cancelled when a new connection took this place.
    pub fn evicted(&self) -> &CancellationToken {
        &self.state.evict
    }

    /// The connection is through its way in (TLS, authentication).
    pub fn opened(&self) {
        let mut t = self.places.table.lock().expect("places lock");
        if let Some(h) = t.held.get_mut(&self.id) {
            if std::mem::take(&mut h.opening) {
                t.opening -= 1;
            }
        }
    }

    /// A message from the holder: it is less idle than those quiet since.
    pub fn touch(&self) {
        let now = self.places.ms(Instant::now());
        self.state.active.store(now, Ordering::Relaxed);
    }

    /// From now on the place is not taken back (a configuration, a group).
    /// False if it already was: the connection must end.
    pub fn hold(&self) -> bool {
        let stage = &self.state.stage;
        match stage.compare_exchange(IDLE, HELD, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(now) => now == HELD,
        }
    }

    /// Unconfigured again (its configuration failed): the place may be taken
    /// back once more, counting idleness from now.
    pub fn unhold(&self) {
        self.touch();
        let stage = &self.state.stage;
        let _ = stage.compare_exchange(HELD, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut t = self.places.table.lock().expect("places lock");
        if let Some(h) = t.held.remove(&self.id) {
            t.opening -= usize::from(h.opening);
        }
    }
}

fn reason(port: Port, max_users: usize, max_nodes: usize) -> String {
    let (limit, what, flag) = match port {
        Port::Users => (max_users, "user", "--max-users"),
        Port::Nodes => (max_nodes, "node", "--max-nodes"),
    };
    format!("the server is at its limit of {limit} {what} connection(s) ({flag}); try again later")
}

/// Tells the peer why, in the only form it understands: an error for a
/// hello peer that announced the `error` feature, a negative configuration
/// response for a seed-format user whose first message is a configuration,
/// nothing otherwise. Then closes after draining what the peer sent, so the
/// close does not reset the connection before the answer is read.
async fn answer(port: Port, mut stream: TcpStream, reason: String) -> std::io::Result<()> {
    let mut hb = [0u8; HEADER_LEN];
    stream.read_exact(&mut hb).await?;
    let Ok(header) = Header::decode(&hb, u32::MAX) else {
        return Ok(());
    };
    let reply = match header.ty {
        MsgType::Hello if header.size <= MAX_HELLO => {
            let mut payload = vec![0u8; header.size as usize];
            stream.read_exact(&mut payload).await?;
            let role = match port {
                Port::Users => "user",
                Port::Nodes => "node",
            };
            match Hello::decode(&payload) {
                Ok(h) if h.role == role && h.has(features::ERROR) => {
                    Some(ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Internal, reason).to_frame())
                }
                _ => None,
            }
        }
        MsgType::Configuration if port == Port::Users => Some(
            ConfigurationResponse {
                status: ConfigurationResponse::FAILED,
            }
            .to_frame(),
        ),
        _ => None,
    };
    if let Some(f) = reply {
        stream.write_all(&f.to_vec()).await?;
        stream.shutdown().await?;
        tokio::io::copy(&mut stream, &mut tokio::io::sink()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ: Duration = Duration::from_secs(10);

    /// At `max`, a new connection takes the place of the idlest one that
    /// holds only its place (touched ones are less idle); held places are
    /// never taken, and with none left the new one is refused. A place
    /// taken back cannot be held any more; one given back is free again.
    #[tokio::test(start_paused = true)]
    async fn a_full_port_takes_back_the_idlest_unheld_place() {
        let places = Places::new(3, 1, READ);
        let step = Duration::from_millis(10);
        let a = places.admit(false).unwrap();
        tokio::time::advance(step).await;
        let b = places.admit(false).unwrap();
        tokio::time::advance(step).await;
        let c = places.admit(false).unwrap();
        tokio::time::advance(step).await;
        a.touch();
        assert!(c.hold(), "configured");
        let d = places.admit(false).unwrap();
        assert!(b.evicted().is_cancelled(), "b was the idlest");
        assert!(!b.hold(), "too late to configure");
        assert!(!a.evicted().is_cancelled() && !c.evicted().is_cancelled());
        assert_eq!(places.held(), 3);
        drop(b);
        assert_eq!(places.held(), 3, "b's place is d's");
        assert!(a.hold() && d.hold());
        assert_eq!(places.admit(false).unwrap_err(), Full::Places);
        d.unhold();
        let e = places.admit(false).unwrap();
        assert!(d.evicted().is_cancelled(), "unconfigured again");
        drop(e);
        assert_eq!(places.held(), 2);
        places.admit(false).unwrap();
    }

    /// At the opening cap a new connection is refused while those on their
    /// way in are young, and takes the place of one stalled for a tenth of
    /// the read timeout; one through its way in no longer counts.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_opening_yields_to_a_new_one() {
        let places = Places::new(8, 2, READ);
        let a = places.admit(true).unwrap();
        let b = places.admit(true).unwrap();
        assert_eq!(places.admit(true).unwrap_err(), Full::Opening(2));
        assert!(places.admit(false).is_ok(), "no way in to go through");
        tokio::time::advance(READ / STALLED_SHARE - Duration::from_millis(1)).await;
        assert_eq!(places.admit(true).unwrap_err(), Full::Opening(2));
        tokio::time::advance(Duration::from_millis(1)).await;
        let c = places.admit(true).unwrap();
        assert!(a.evicted().is_cancelled(), "the oldest stalled one");
        assert!(!b.evicted().is_cancelled());
        b.opened();
        let d = places.admit(true).unwrap();
        assert!(!b.evicted().is_cancelled(), "b is through its way in");
        assert_eq!(
            places.admit(true).unwrap_err(),
            Full::Opening(2),
            "c, d young"
        );
        drop((c, d));
        places.admit(true).unwrap();
    }

    #[test]
    fn reasons_name_the_limit_and_the_flag() {
        let r = reason(Port::Users, 3, 9);
        assert!(
            r.contains("limit of 3 user") && r.contains("--max-users"),
            "{r}"
        );
        let r = reason(Port::Nodes, 3, 9);
        assert!(
            r.contains("limit of 9 node") && r.contains("--max-nodes"),
            "{r}"
        );
    }
}
