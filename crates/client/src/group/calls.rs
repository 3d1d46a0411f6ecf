//! Sending group commands and collecting their replies: every command has
//! a sequence number; several may be in flight; replies to one that is not
//! being waited for are kept for it. Every wait is bounded.

use std::collections::BTreeSet;
use std::io;
use std::time::{Duration, Instant};

use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::codec::ReadError;
use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupReply, ALL_RANKS, NO_CULPRIT};
use corefarm_smp::{ErrorMsg, MsgType};

use super::{io_err, Group, GroupError, Result};
use crate::tls::RecvHalf;
use crate::ClientError;

impl Group {
    /// Sends a command and waits for every targeted rank's reply.
    pub(super) fn call(&mut self, c: GroupCmd) -> Result<Vec<GroupReply>> {
        let call = self.begin(c)?;
        self.wait(call)
    }

    /// Sends a command without waiting for it: several may be in flight
    /// (each member runs them in order), each finished with [`Group::finish`].
    pub(super) fn begin(&mut self, c: GroupCmd) -> Result<Call> {
        self.check_open()?;
        let n = self.size();
        if c.target != ALL_RANKS && c.target >= n {
            return Err(GroupError::Usage(format!(
                "rank {} in a group of {n}",
                c.target
            )));
        }
        let frame = c.to_frame().map_err(|e| GroupError::Usage(e.to_string()))?;
        write_frame(&mut self.writer, frame).map_err(io_err("sending a group command"))?;
        Ok(Call {
            seq: c.seq,
            op: c.label(),
            waiting: if c.target == ALL_RANKS {
                (0..n).collect()
            } else {
                [c.target].into()
            },
        })
    }

    fn fail_of(&self, op: &str, r: &GroupReply) -> GroupError {
        let blamed = (r.culprit != NO_CULPRIT).then_some(r.culprit);
        GroupError::Failed {
            op: op.to_string(),
            rank: blamed.or(Some(r.rank)),
            node: Some(self.label(blamed.unwrap_or(r.rank))),
            reason: if blamed == Some(r.rank) {
                without_labels(r.reason())
            } else {
                format!(
                    "rank {} ({}) reports: {}",
                    r.rank,
                    self.label(r.rank),
                    without_labels(r.reason())
                )
            },
        }
    }

    /// Collects the replies of `call`; replies to other calls in flight are
    /// kept for them.
    pub(super) fn wait(&mut self, call: Call) -> Result<Vec<GroupReply>> {
        let Call {
            seq,
            op,
            mut waiting,
            ..
        } = call;
        // The nodes bound every wait by the timeout; the grace covers the
        // report of a failure travelling back.
        let after = self.timeout + Duration::from_secs(5);
        let deadline = Instant::now() + after;
        let mut replies = Vec::new();
        let mut first_fail: Option<GroupError> = None;
        let mut early = std::mem::take(&mut self.early);
        early.retain(|r| {
            r.seq != seq || {
                if waiting.remove(&r.rank) {
                    replies.push(r.clone());
                }
                false
            }
        });
        self.early = early;
        let mut mine = std::mem::take(&mut replies).into_iter();
        loop {
            let r = match mine.next() {
                Some(r) => r,
                None if waiting.is_empty() => break,
                None => {
                    if let Some(reason) = &self.closed {
                        return Err(GroupError::Failed {
                            op,
                            rank: None,
                            node: None,
                            reason: format!("the group was torn down: {reason}"),
                        });
                    }
                    match self.next_reply(deadline, &op, &waiting, after)? {
                        Some(r) if r.seq == seq && waiting.remove(&r.rank) => r,
                        Some(r) => {
                            self.early.push(r);
                            continue;
                        }
                        None => continue,
                    }
                }
            };
            if r.status == 0 {
                replies.push(r);
                continue;
            }
            let e = self.fail_of(&op, &r);
            if r.culprit != NO_CULPRIT {
                // The server ends the group; the others may never answer.
                self.closed.get_or_insert_with(|| e.to_string());
                return Err(e);
            }
            first_fail.get_or_insert(e);
        }
        match first_fail {
            Some(e) => Err(e),
            None => Ok(replies),
        }
    }

    /// The next reply from the server; `None` after a control message that
    /// closed the group (recorded in `closed`).
    fn next_reply(
        &mut self,
        deadline: Instant,
        op: &str,
        waiting: &BTreeSet<u32>,
        after: Duration,
    ) -> Result<Option<GroupReply>> {
        let f = match read_until(&mut self.reader, deadline, "waiting for a group reply") {
            Ok(f) => f,
            Err(GroupError::Client(ClientError::Timeout { .. })) => {
                let waiting: Vec<u32> = waiting.iter().copied().collect();
                let nodes = waiting
                    .iter()
                    .map(|&r| self.label(r))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(GroupError::Timeout {
                    op: op.to_string(),
                    after,
                    waiting,
                    nodes,
                });
            }
            Err(e) => {
                self.closed = Some(e.to_string());
                return Err(e);
            }
        };
        match f.ty {
            MsgType::GroupReply => Ok(Some(
                GroupReply::parse(f.payload).map_err(ClientError::Protocol)?,
            )),
            MsgType::GroupCtl => {
                if let Ok(GroupCtl::Closed { reason, .. }) = GroupCtl::decode(&f.payload) {
                    self.closed = Some(reason.unwrap_or_else(|| "closed".into()));
                }
                Ok(None)
            }
            MsgType::Error => {
                let e = ErrorMsg::parse(&f.payload).map_err(ClientError::Protocol)?;
                self.closed = Some(e.to_string());
                Err(ClientError::Server(e).into())
            }
            _ => Err(unexpected(&f, "a group reply")),
        }
    }
}

/// `reason` without the nodes' own names of the command (`allreduce #1
/// (binomial, root 0, i32 sum): `, `barrier #6: `) at the start of it or
/// of any part after a `: `: the error already begins with the client's
/// name of the call, and a node numbers its collectives apart from the
/// client's command numbers, so they only repeat the call, differently.
pub(super) fn without_labels(reason: &str) -> String {
    /// The length of a command's label with its `: ` at the start of `s`.
    fn label_len(s: &str) -> Option<usize> {
        let (name, rest) = s.split_once(" #")?;
        if !(0..=u8::MAX).any(|c| Cmd::from_u8(c).is_ok_and(|c| c.name() == name)) {
            return None;
        }
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut at = name.len() + 2 + digits;
        if let Some(details) = s[at..].strip_prefix(" (") {
            at += 2 + details.find(')')? + 1;
        }
        s[at..].starts_with(": ").then_some(at + 2)
    }
    let mut out = String::with_capacity(reason.len());
    let mut rest = reason;
    loop {
        if let Some(n) = label_len(rest) {
            rest = &rest[n..];
            continue;
        }
        match rest.find(": ") {
            Some(i) => {
                out.push_str(&rest[..i + 2]);
                rest = &rest[i + 2..];
            }
            None => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// A command in flight (see [`Group::begin_run`]).
#[derive(Debug)]
#[must_use = "a call is finished with Group::finish"]
pub struct Call {
    seq: u32,
    op: String,
    waiting: BTreeSet<u32>,
}

pub(super) fn unexpected(f: &corefarm_smp::Frame, waiting_for: &str) -> GroupError {
    if f.ty == MsgType::Error {
        if let Ok(e) = ErrorMsg::parse(&f.payload) {
            return ClientError::Server(e).into();
        }
    }
    ClientError::Unexpected(format!(
        "a {} message while waiting for {waiting_for}",
        f.ty.name()
    ))
    .into()
}

/// Next frame before `deadline`.
pub(super) fn read_until(
    reader: &mut FrameReader<RecvHalf>,
    deadline: Instant,
    during: &'static str,
) -> Result<corefarm_smp::Frame> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ClientError::Timeout {
            after: Duration::ZERO,
            during,
        }
        .into());
    }
    reader
        .get_ref()
        .tcp()
        .set_read_timeout(Some(left))
        .map_err(io_err("configuring the socket"))?;
    match reader.read_frame() {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err(ClientError::Closed { during }.into()),
        Err(ReadError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(ClientError::Timeout {
                after: left,
                during,
            }
            .into())
        }
        Err(ReadError::Io(source)) => Err(ClientError::Io { during, source }.into()),
        Err(ReadError::Protocol(e)) => Err(ClientError::Protocol(e).into()),
    }
}
