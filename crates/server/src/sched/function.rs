//! A function: one configuration payload, whoever sent it. Its identity is
//! the SHA-256 of the payload (core table, sizes and bitstream or image), so
//! users configuring the same thing share its replicas and its queue.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::classq::ClassDrr;
use super::Job;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FnId(pub [u8; 32]);

impl FnId {
    pub fn of(payload: &[u8]) -> FnId {
        FnId(Sha256::digest(payload).into())
    }

    /// The first 6 bytes in hex: how status and logs name a function.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

impl std::fmt::Display for FnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.short())
    }
}

/// Reasons kept per function for a negative configuration response.
const MAX_REASONS: usize = 16;
/// Longest reason kept, in bytes.
const MAX_REASON_BYTES: usize = 512;

#[derive(Debug)]
pub struct Function {
    pub id: FnId,
    /// How status and metrics name it: the image's name and digest
    /// ([`crate::metrics::function_label`]), read once from the payload.
    pub label: String,
    /// The configuration payload, sent to every node that loads it.
    pub payload: Bytes,
    pub output_size: u32,
    pub queue: ClassDrr<Job>,
    /// Users whose current configuration this is.
    pub users: BTreeSet<u64>,
    /// Users waiting for their positive configuration response.
    pub waiting: Vec<u64>,
    /// Since when the function has wanted a replica it does not have
    /// (Algorithm 1's "function request"); `None`: not requested.
    pub requested: Option<Duration>,
    /// Seconds of node time per input, measured (moving average).
    pub service: Option<f64>,
    /// Inputs answered during the current monitoring period.
    pub processed: u64,
    /// Demand of the last completed period, node-seconds.
    pub demand: f64,
    /// Times a node was configured for it.
    pub reconfigurations: u64,
    /// Reasons nodes gave for refusing it (reported with a negative response).
    pub refusals: Vec<String>,
    /// Nodes lost (closed, timed out) while loading it since it last loaded.
    pub lost_loads: u32,
    /// Its late jobs may be hedged (no streaming handler sets).
    pub hedgeable: bool,
    /// Hedged jobs whose two copies are both in flight.
    pub hedged: usize,
}

impl Function {
    pub fn new(id: FnId, payload: Bytes, input_size: u32, output_size: u32) -> Self {
        let cfg = corefarm_smp::Configuration::parse(payload.clone()).ok();
        let label = cfg
            .as_ref()
            .map_or_else(|| id.short(), crate::metrics::function_label);
        // A payload that is no configuration (only the unit tests send one)
        // carries no handler sets.
        let hedgeable = cfg
            .as_ref()
            .is_none_or(|c| crate::dispatch::progress::hedgeable(&c.bitstream));
        Function {
            id,
            label,
            payload,
            output_size,
            queue: ClassDrr::new(input_size as u64),
            users: BTreeSet::new(),
            waiting: Vec::new(),
            requested: None,
            service: None,
            processed: 0,
            demand: 0.0,
            reconfigurations: 0,
            refusals: Vec::new(),
            lost_loads: 0,
            hedgeable,
            hedged: 0,
        }
    }

    /// One job of `inputs` inputs took `took` of node time.
    pub fn record_service(&mut self, took: Duration, inputs: u32) {
        self.service = Some(crate::dispatch::progress::record_service(
            self.service,
            took,
            inputs,
        ));
        self.processed += inputs as u64;
    }

    /// Seconds per input, or `prior` before the first measurement.
    pub fn service_or(&self, prior: Duration) -> f64 {
        self.service.unwrap_or(prior.as_secs_f64())
    }

    /// Demand over the period that just ended, in node-seconds: the work
    /// processed in it plus the work still waiting (queued and in flight).
    /// Counting both covers the seed's two blind spots (§5.4.7): work that
    /// arrives and drains between two samples, and a backlog submitted before
    /// the period began.
    pub fn close_period(&mut self, in_flight_inputs: u64, prior: Duration) -> f64 {
        let queued: u64 = self.queue.iter().map(|j| j.count as u64).sum();
        let inputs = self.processed + queued + in_flight_inputs;
        self.demand = inputs as f64 * self.service_or(prior);
        self.processed = 0;
        self.demand
    }

    /// Records why a node did not load it; nodes are untrusted, so only the
    /// first few reasons are kept.
    pub fn note(&mut self, mut why: String) {
        if self.refusals.len() < MAX_REASONS {
            if why.len() > MAX_REASON_BYTES {
                let mut end = MAX_REASON_BYTES;
                while !why.is_char_boundary(end) {
                    end -= 1;
                }
                why.truncate(end);
                why.push('…');
            }
            self.refusals.push(why);
        }
    }

    /// Users, queued work or a pending configuration: someone cares.
    pub fn wanted(&self) -> bool {
        !self.users.is_empty() || !self.queue.is_empty() || !self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_the_payload_digest() {
        let a = FnId::of(b"cfg-a");
        assert_eq!(a, FnId::of(b"cfg-a"));
        assert_ne!(a, FnId::of(b"cfg-b"));
        assert_eq!(a.short().len(), 12);
    }

    #[test]
    fn a_nodes_reasons_are_bounded() {
        let mut f = Function::new(FnId::of(b"x"), Bytes::new(), 4, 4);
        for _ in 0..100 {
            f.note("é".repeat(1000));
        }
        assert_eq!(f.refusals.len(), MAX_REASONS);
        assert!(f.refusals[0].len() <= MAX_REASON_BYTES + '…'.len_utf8());
    }

    #[test]
    fn demand_counts_processed_and_waiting_work() {
        let mut f = Function::new(FnId::of(b"x"), Bytes::new(), 4, 4);
        f.record_service(Duration::from_millis(4), 2); // 2 ms per input
        f.record_service(Duration::from_millis(2), 1);
        let d = f.close_period(3, Duration::from_millis(1));
        // 3 processed + 3 in flight, 2 ms each.
        assert!((d - 0.012).abs() < 1e-9, "{d}");
        assert_eq!(f.processed, 0);
        // Next period: nothing happened.
        assert_eq!(f.close_period(0, Duration::from_millis(1)), 0.0);
    }
}
