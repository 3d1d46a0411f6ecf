//! The receiving task's side of chunked data messages (type 0x1D), on a
//! link whose server agreed to chunks: the same checks as a data message
//! read whole, made at its first chunk, then the chunks go where
//! [`crate::inbound`] says.

use bytes::Bytes;
use corefarm_smp::stream::Chunk;
use corefarm_smp::{ErrorCode, ErrorMsg, ProtocolError, DATA_ID_LEN};

use super::{Session, Step};
use crate::handlers::{Job, Outgoing};
use crate::inbound::{self, Dest};
use crate::NodeError;

impl Session<'_> {
    pub(super) async fn chunk(&mut self, payload: Bytes) -> Step {
        let c = match Chunk::parse(payload) {
            Ok(c) => c,
            Err(e) => return self.malformed(e),
        };
        let inb = self.inbound.as_mut().expect("called once chunks are on");
        match inb.push(c) {
            Err(e) => self.malformed(e),
            Ok(step) => self.chunk_step(step).await,
        }
    }

    /// What a chunk (read as a frame or placed) means for the session.
    pub(super) async fn chunk_step(&mut self, step: inbound::Step) -> Step {
        match step {
            inbound::Step::Taken => None,
            inbound::Step::Whole {
                id,
                class,
                data,
                count,
                reservation,
            } => {
                self.submit(Job {
                    id,
                    class,
                    data,
                    count,
                    reservation,
                    queued: std::time::Instant::now(),
                })
                .await
            }
            inbound::Step::Begin(c) => self.begin(c).await,
        }
    }

    /// The first chunk of a message: checked as a whole message would be,
    /// its memory reserved, and its destination chosen on these bytes.
    async fn begin(&mut self, c: Chunk) -> Step {
        let Some(cfg) = self.state.as_ref().map(|s| &s.cfg) else {
            let reason = "data message before any configuration";
            self.error(ErrorMsg::NO_ID, ErrorCode::NotConfigured, reason);
            return Some(Err(NodeError::Session(reason.into())));
        };
        let output_size = cfg.output_size as u64;
        let id = c.head.id;
        // The limit of a message read whole, id included.
        let size = c.head.total.saturating_add(DATA_ID_LEN as u64);
        if size > self.limit as u64 {
            let e = ProtocolError::TooLarge {
                size: u32::try_from(size).unwrap_or(u32::MAX),
                max: self.limit,
            };
            self.error(id, e.code(), e.to_string());
            return Some(Err(NodeError::Protocol(e)));
        }
        let count = match cfg.count_inputs(c.head.total as usize) {
            Ok(n) => n as u64,
            Err(e) => {
                self.error(id, e.code(), e.to_string());
                return Some(Err(NodeError::Protocol(e)));
            }
        };
        self.chunking.class_of(id, c.head.class);
        let out_len = count * output_size;
        if out_len + DATA_ID_LEN as u64 > self.limit as u64 {
            let reason = format!(
                "{count} outputs of {output_size} bytes ({out_len} bytes) do not fit the \
                 message limit of {} bytes",
                self.limit
            );
            return self.refuse(&c, reason);
        }
        let need = (c.head.total + out_len) as usize;
        if c.head.last {
            let reservation = self.guard.reserve(need).await;
            let job = Job {
                id,
                class: c.head.class,
                data: c.data,
                count: count as usize,
                reservation,
                queued: std::time::Instant::now(),
            };
            return self.submit(job).await;
        }
        // Messages still arriving hold their memory until their last chunk,
        // which is behind this one: waiting for more than they leave would
        // never end.
        let inb = self.inbound.as_ref().expect("chunks are on");
        let (limit, held) = (self.guard.limit(), inb.reserved());
        let want = need.min(limit);
        if inb.open_count() > 0 && want + held > limit {
            let reason = format!(
                "message {id} of {} bytes needs {want} bytes of the node's memory guard \
                 ({limit} bytes), and {held} are held by {} message(s) still arriving",
                c.head.total,
                inb.open_count()
            );
            return self.refuse(&c, reason);
        }
        let reservation = self.guard.reserve(need).await;
        let st = self.state.as_mut().expect("configured: checked above");
        let matched = st
            .workers
            .spin()
            .and_then(|lane| lane.select(&c.data).map(|ctx| (lane, ctx)));
        let dest = match matched {
            Some((lane, ctx)) => {
                let (job, tx) = inbound::stream_job(&c, count as usize, reservation);
                if !lane.submit_stream(ctx, job).await {
                    return Some(Err(NodeError::Session("the handler lane stopped".into())));
                }
                if let Some(s) = &self.stats {
                    s.job();
                }
                Dest::Spin(tx)
            }
            None => {
                let mut buf = Vec::with_capacity(c.head.total as usize);
                buf.extend_from_slice(&c.data);
                Dest::Cores {
                    buf,
                    count: count as usize,
                    reservation,
                }
            }
        };
        let inb = self.inbound.as_mut().expect("chunks are on");
        inb.open(&c, want, dest);
        None
    }

    /// Fails one message with `reason` (the session goes on); the rest of
    /// its chunks are read and dropped.
    fn refuse(&mut self, c: &Chunk, reason: String) -> Step {
        self.queue(Outgoing::Failed {
            id: c.head.id,
            code: ErrorCode::TooLarge,
            reason,
            reservation: None,
        });
        if !c.head.last {
            let inb = self.inbound.as_mut().expect("chunks are on");
            inb.open(c, 0, Dest::Discard);
        }
        None
    }
}
