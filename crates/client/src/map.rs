//! `Client::map`: stream inputs through the farm and get results back in
//! input order, with a bounded number of data messages in flight. Each
//! input is sent with `submit_pending`, so the results come to this
//! iterator only, whatever other threads do with the client.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::{Client, ClientError, Pending, Result};

/// One input of a map in flight: sent, or refused by the client.
#[derive(Debug)]
enum Entry {
    Sent(Pending),
    /// The client refused to send this input: its result, and whether it
    /// ends the map (a failure for the whole session, not this input's).
    Refused(ClientError, bool),
}

/// Iterator returned by [`Client::map`]. Each item is the result of the
/// input at the same position, or the server's error for it, or the
/// client's refusal to send it (not a whole number of inputs, too large).
/// After a connection-level error the iterator yields that error once, in
/// the place of the first input it cost, and ends.
/// Dropping it early abandons the results still in flight.
#[derive(Debug)]
pub struct MapIter<'a, I> {
    client: &'a Client,
    inputs: I,
    window: usize,
    /// Priority class of every input.
    class: u8,
    /// In flight, oldest first, with the inputs whose submission failed
    /// in their places.
    pending: VecDeque<Entry>,
    exhausted: bool,
    failed: bool,
    /// The client's configuration count when the map began: its inputs are
    /// for that configuration's function only.
    generation: u64,
}

impl<'a, I: Iterator<Item = Bytes>> MapIter<'a, I> {
    pub(crate) fn new(client: &'a Client, inputs: I, window: usize, class: u8) -> Self {
        MapIter {
            client,
            inputs,
            window: window.max(1),
            class,
            pending: VecDeque::new(),
            exhausted: false,
            failed: false,
            generation: client.inner.generation(),
        }
    }

    fn stop(&mut self, e: ClientError) -> Option<Result<Bytes>> {
        self.failed = true;
        self.pending.clear();
        Some(Err(e))
    }
}

impl<I: Iterator<Item = Bytes>> Iterator for MapIter<'_, I> {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        while !self.exhausted && self.pending.len() < self.window {
            match self.inputs.next() {
                Some(b) => match self.client.inner.submit_pending_in(
                    crate::inner::Body::Shared(b),
                    crate::inner::CreditWait::Block,
                    self.class,
                    Some(self.generation),
                ) {
                    Ok(p) => self
                        .pending
                        .push_back(Entry::Sent(p.expect("a blocking submit sends"))),
                    // In its place, after the results of the inputs sent
                    // before it. An input the client refuses (its size) is
                    // that input's result; any other failure ends the map
                    // there, so nothing after it is sent.
                    Err(e) => {
                        let this_input = matches!(e, ClientError::InvalidInput(_))
                            && self.class < corefarm_smp::stream::CLASSES;
                        self.exhausted = !this_input;
                        self.pending.push_back(Entry::Refused(e, !this_input));
                    }
                },
                None => self.exhausted = true,
            }
        }
        let front = match self.pending.pop_front()? {
            Entry::Sent(p) => p,
            Entry::Refused(e, false) => return Some(Err(e)),
            Entry::Refused(e, true) => return self.stop(e),
        };
        match front.wait(None) {
            Ok(out) => Some(Ok(out.data)),
            // The server's error for this input is this input's result; one
            // for the whole session ends the map.
            Err(ClientError::Server(e)) if e.id == front.id() => Some(Err(ClientError::Server(e))),
            Err(e) => self.stop(e),
        }
    }
}
