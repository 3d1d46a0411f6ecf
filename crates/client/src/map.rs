//! `Client::map`: stream inputs through the farm and get results back in
//! input order, with a bounded number of data messages in flight.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use crate::{Client, ClientError, Result};

/// Iterator returned by [`Client::map`]. Each item is the result of the
/// input at the same position, or the error for it. After a connection-level
/// error the iterator yields that error once and ends.
#[derive(Debug)]
pub struct MapIter<'a, I> {
    client: &'a Client,
    inputs: I,
    window: usize,
    /// Ids in flight, oldest first.
    pending: VecDeque<u32>,
    /// Results that arrived ahead of an older one.
    ready: HashMap<u32, Result<Bytes>>,
    exhausted: bool,
    failed: bool,
}

impl<'a, I: Iterator<Item = Bytes>> MapIter<'a, I> {
    pub(crate) fn new(client: &'a Client, inputs: I, window: usize) -> Self {
        MapIter {
            client,
            inputs,
            window: window.max(1),
            pending: VecDeque::new(),
            ready: HashMap::new(),
            exhausted: false,
            failed: false,
        }
    }

    fn stop(&mut self, e: ClientError) -> Option<Result<Bytes>> {
        self.failed = true;
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
                Some(b) => match self.client.submit(b) {
                    Ok(id) => self.pending.push_back(id),
                    Err(e) => return self.stop(e),
                },
                None => self.exhausted = true,
            }
        }
        let front = *self.pending.front()?;
        loop {
            if let Some(r) = self.ready.remove(&front) {
                self.pending.pop_front();
                return Some(r);
            }
            match self.client.recv(None) {
                Ok(out) => {
                    self.ready.insert(out.id, Ok(out.data));
                }
                // An error for one of our inputs is that input's result.
                Err(ClientError::Server(e)) if self.pending.contains(&e.id) => {
                    self.ready.insert(e.id, Err(ClientError::Server(e)));
                }
                Err(e) => return self.stop(e),
            }
        }
    }
}
