//! Groups of nodes driven by one user (the `group` feature, seed 003).
//!
//! - [`GroupCtl`] (type 0x18, JSON): opening and closing a group. The user
//!   asks the server to `open` a group of N nodes; the server gang-allocates
//!   them and tells each node to `join` (members, ranks, topology); each
//!   answers `joined`; the user gets `opened` with the member list. `close`
//!   (user) or a lost member ends the group: the server tells the others to
//!   `leave` and the user that it is `closed`.
//! - [`GroupCmd`] (type 0x19, binary): one command for one rank or for every
//!   rank of the group: put, get or free a resident buffer, configure the
//!   cores, run them over a buffer, or a collective among the nodes. The
//!   server relays it unchanged to the ranks it targets.
//! - [`GroupReply`] (type 0x1A, binary): one rank's answer to a command,
//!   relayed unchanged to the user (the server writes the rank itself, so a
//!   node cannot answer for another).
//!
//! Parsing is check-then-parse; see docs/protocol.md for the bytes.

use bytes::{Buf, Bytes};
use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;
use crate::header::MsgType;
use crate::outframe::OutFrame;
use crate::peer::{Algo, DType, ReduceOp};
use crate::priority::{class_field, class_from_field};
use crate::stream::DEFAULT_CLASS;

/// Largest group a user may ask for (bounds every member list).
pub const MAX_GROUP: u32 = 1024;
/// Longest buffer name.
pub const MAX_NAME: usize = 255;
/// Fixed part of a command before the names.
pub const CMD_HEADER_LEN: usize = 24;
/// Fixed part of a reply before its data or reason.
pub const REPLY_HEADER_LEN: usize = 16;
/// `target` of a command for every rank.
pub const ALL_RANKS: u32 = u32::MAX;
/// `src` of the peer hello with which a user opens a direct connection to
/// a member's peer port (its body carries the group's token, as a node's
/// hello does; its name is free).
pub const DIRECT_USER: u32 = u32::MAX;
/// `culprit` of a reply that blames no member.
pub const NO_CULPRIT: u32 = u32::MAX;

fn bad(what: impl Into<String>) -> ProtocolError {
    ProtocolError::BadGroup(what.into())
}

/// A member of a group as the server announces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupMember {
    pub rank: u32,
    pub name: String,
    /// The node's peer address, `IP:PORT`.
    pub peer: String,
}

/// A member is a JSON object too: serde's derive would also take the array
/// of its fields in declaration order (`[0,"n-0","10.0.0.5:4000"]`), which
/// the spec does not allow and no other implementation would accept.
impl<'de> Deserialize<'de> for GroupMember {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Fields {
            rank: u32,
            name: String,
            peer: String,
        }
        let map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        let f: Fields = serde_json::from_value(serde_json::Value::Object(map))
            .map_err(serde::de::Error::custom)?;
        Ok(GroupMember {
            rank: f.rank,
            name: f.name,
            peer: f.peer,
        })
    }
}

/// Group control (type 0x18): a JSON object whose `op` says which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum GroupCtl {
    /// User → server: a group of `nodes` nodes linked as `topology`
    /// (`mesh`, `ring`, `tree` or `torus:<cols>`; default `mesh`).
    Open {
        nodes: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topology: Option<String>,
    },
    /// Server → user: the group exists; `members[r]` has rank r. `token`
    /// admits the user's direct connections to the members' peer ports.
    Opened {
        group: u32,
        members: Vec<GroupMember>,
        #[serde(default)]
        token: u64,
    },
    /// Server → node: join `group` as `rank`; admit direct users showing `token`.
    Join {
        group: u32,
        rank: u32,
        members: Vec<GroupMember>,
        topology: String,
        #[serde(default)]
        token: u64,
    },
    /// Node → server: linked to its neighbours (or `error` says why not).
    Joined {
        group: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Server → node: the group ended; its buffers are freed.
    Leave { group: u32 },
    /// User → server: end the group (the nodes go back to the pool).
    Close,
    /// Server → user: a member was lost while no command waited for it. The
    /// group's next command fails naming it and ends the group; until then
    /// the other members keep their buffers and direct connections.
    Lost {
        group: u32,
        rank: u32,
        reason: String,
    },
    /// Server → user: the group ended, and why if not on request.
    Closed {
        group: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl GroupCtl {
    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        if !crate::hello::is_json_object(payload) {
            return Err(bad("not a JSON object"));
        }
        let c: GroupCtl = serde_json::from_slice(payload).map_err(|e| bad(e.to_string()))?;
        let members = match &c {
            GroupCtl::Open { nodes, .. } if *nodes == 0 || *nodes > MAX_GROUP => {
                return Err(bad(format!("a group of {nodes} nodes (1 to {MAX_GROUP})")))
            }
            GroupCtl::Opened { members, .. } | GroupCtl::Join { members, .. } => members,
            _ => return Ok(c),
        };
        if members.is_empty() || members.len() > MAX_GROUP as usize {
            return Err(bad(format!("a member list of {}", members.len())));
        }
        if let Some((i, m)) = members
            .iter()
            .enumerate()
            .find(|(i, m)| m.rank != *i as u32)
        {
            return Err(bad(format!("member {i} has rank {}", m.rank)));
        }
        if let GroupCtl::Join { rank, .. } = &c {
            if *rank as usize >= members.len() {
                return Err(bad(format!("rank {rank} of {}", members.len())));
            }
        }
        Ok(c)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("group control serialises")
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::small(MsgType::GroupCtl, &[], Bytes::from(self.encode()))
    }
}

macro_rules! cmd_enum {
    ($($(#[$m:meta])* $v:ident = $n:literal => $s:literal),+ $(,)?) => {
        /// What a group command asks of a node.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Cmd { $($(#[$m])* $v = $n),+ }

        impl Cmd {
            pub fn from_u8(v: u8) -> Result<Self, ProtocolError> {
                match v {
                    $($n => Ok(Cmd::$v),)+
                    other => Err(bad(format!("unknown group command {other}"))),
                }
            }

            pub fn name(self) -> &'static str {
                match self { $(Cmd::$v => $s),+ }
            }
        }
    };
}

cmd_enum!(
    /// Data: a configuration message's payload; every targeted node loads it for `run`.
    Configure = 1 => "configure",
    /// Creates buffer `a` (of `dtype`) holding the data.
    Put = 2 => "put",
    /// The reply carries buffer `a`.
    Get = 3 => "get",
    /// Frees buffer `a`.
    Free = 4 => "free",
    /// Buffer `a` of `root` into buffer `b` of every member.
    Bcast = 5 => "bcast",
    /// Element-wise reduction of every member's `a` into `b` of `root`.
    Reduce = 6 => "reduce",
    /// Element-wise reduction of every member's `a` into `b` of every member.
    Allreduce = 7 => "allreduce",
    /// Every member's `a`, in rank order, into `b` of every member.
    Allgather = 8 => "allgather",
    /// Returns once every member has entered it.
    Barrier = 9 => "barrier",
    /// The configured cores over every input of `a`; the outputs into `b`.
    /// Non-empty data names an operand buffer appended to every input.
    Run = 10 => "run",
);

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Cmd {
    /// Commands that every member must run together (in the same order).
    pub fn is_collective(self) -> bool {
        matches!(
            self,
            Cmd::Bcast | Cmd::Reduce | Cmd::Allreduce | Cmd::Allgather | Cmd::Barrier
        )
    }
}

/// A group command (type 0x19).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCmd {
    /// The user numbers its commands; replies carry the number back.
    pub seq: u32,
    /// A rank, or [`ALL_RANKS`].
    pub target: u32,
    pub cmd: Cmd,
    /// `None` on the wire is 0 ("auto"): the client resolves it before sending.
    pub algo: Option<Algo>,
    pub dtype: DType,
    pub reduce: ReduceOp,
    pub root: u32,
    /// How long the node may wait on other members for this command.
    pub timeout_ms: u32,
    /// Priority class 0 (most urgent) … 7 of a collective's data on the
    /// links between members. On the wire only where both ends
    /// agreed `features::GROUP_PRIORITY`; [`DEFAULT_CLASS`] is written as
    /// the bytes of a command without one.
    pub class: u8,
    pub a: String,
    pub b: String,
    pub data: Bytes,
}

fn name(b: &[u8], what: &str) -> Result<String, ProtocolError> {
    std::str::from_utf8(b)
        .map(str::to_string)
        .map_err(|_| bad(format!("{what} is not UTF-8")))
}

/// Headers and body in one payload: commands and replies are copied once
/// here (a server relays their payloads without copying).
fn with_head(ty: MsgType, mut head: Vec<u8>, body: &[u8]) -> Result<OutFrame, ProtocolError> {
    head.extend_from_slice(body);
    OutFrame::new(ty, Bytes::from(head))
}

impl GroupCmd {
    pub fn new(seq: u32, target: u32, cmd: Cmd) -> Self {
        GroupCmd {
            seq,
            target,
            cmd,
            algo: None,
            dtype: DType::Bytes,
            reduce: ReduceOp::None,
            root: 0,
            timeout_ms: 10_000,
            class: DEFAULT_CLASS,
            a: String::new(),
            b: String::new(),
            data: Bytes::new(),
        }
    }

    /// Parses a command payload. Never panics.
    pub fn parse(mut p: Bytes) -> Result<Self, ProtocolError> {
        if p.len() < CMD_HEADER_LEN {
            return Err(ProtocolError::Truncated {
                what: "group command",
                got: p.len(),
                need: CMD_HEADER_LEN,
            });
        }
        let seq = p.get_u32_le();
        let target = p.get_u32_le();
        // The low nibble is the command, the high one its class.
        let byte = p.get_u8();
        let cmd =
            Cmd::from_u8(byte & 0x0F).map_err(|_| bad(format!("unknown group command {byte}")))?;
        let class = class_from_field(byte >> 4)
            .ok_or_else(|| bad(format!("unknown group command {byte}")))?;
        let algo = match p.get_u8() {
            0 => None,
            v => Some(Algo::from_u8(v).map_err(|e| bad(e.to_string()))?),
        };
        let dtype = DType::from_u8(p.get_u8()).map_err(|e| bad(e.to_string()))?;
        let reduce = ReduceOp::from_u8(p.get_u8()).map_err(|e| bad(e.to_string()))?;
        let root = p.get_u32_le();
        let timeout_ms = p.get_u32_le();
        let (la, lb) = (p.get_u16_le() as usize, p.get_u16_le() as usize);
        if la > MAX_NAME || lb > MAX_NAME {
            return Err(bad(format!(
                "buffer names of {la} and {lb} bytes (at most {MAX_NAME})"
            )));
        }
        if p.len() < la + lb {
            return Err(ProtocolError::Truncated {
                what: "group command names",
                got: p.len(),
                need: la + lb,
            });
        }
        let a = name(&p[..la], "buffer name")?;
        let b = name(&p[la..la + lb], "buffer name")?;
        p.advance(la + lb);
        Ok(GroupCmd {
            seq,
            target,
            cmd,
            algo,
            dtype,
            reduce,
            root,
            timeout_ms,
            class,
            a,
            b,
            data: p,
        })
    }

    /// Fails only for a name over [`MAX_NAME`] or a payload over 4 GiB.
    pub fn to_frame(&self) -> Result<OutFrame, ProtocolError> {
        if self.a.len() > MAX_NAME || self.b.len() > MAX_NAME {
            return Err(bad(format!("a buffer name is over {MAX_NAME} bytes")));
        }
        let mut v = Vec::with_capacity(CMD_HEADER_LEN + self.a.len() + self.b.len());
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&self.target.to_le_bytes());
        v.extend_from_slice(&[
            self.cmd as u8 | class_field(self.class) << 4,
            self.algo.map_or(0, |a| a as u8),
            self.dtype as u8,
            self.reduce as u8,
        ]);
        v.extend_from_slice(&self.root.to_le_bytes());
        v.extend_from_slice(&self.timeout_ms.to_le_bytes());
        v.extend_from_slice(&(self.a.len() as u16).to_le_bytes());
        v.extend_from_slice(&(self.b.len() as u16).to_le_bytes());
        v.extend_from_slice(self.a.as_bytes());
        v.extend_from_slice(self.b.as_bytes());
        with_head(MsgType::GroupCmd, v, &self.data)
    }

    /// How errors name this command: `allreduce #4`.
    pub fn label(&self) -> String {
        format!("{} #{}", self.cmd, self.seq)
    }

    /// The payload of command `payload` without its class, for a node
    /// that did not agree `features::GROUP_PRIORITY` (an older node would
    /// refuse the command byte). `None`: it carries none, relay it as is.
    pub fn without_class(payload: &Bytes) -> Option<Bytes> {
        let byte = *payload.get(8)?;
        if byte >> 4 == 0 {
            return None;
        }
        let mut v = payload.to_vec();
        v[8] = byte & 0x0F;
        Some(Bytes::from(v))
    }
}

/// One rank's answer to a command (type 0x1A).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReply {
    pub seq: u32,
    pub rank: u32,
    /// 0: done, `data` is the result (a `get`'s buffer, else empty);
    /// otherwise an [`crate::ErrorCode`] and `data` is the reason (UTF-8).
    pub status: u32,
    /// The member held responsible for a failure, or [`NO_CULPRIT`].
    pub culprit: u32,
    pub data: Bytes,
}

impl GroupReply {
    pub fn ok(seq: u32, rank: u32, data: Bytes) -> Self {
        GroupReply {
            seq,
            rank,
            status: 0,
            culprit: NO_CULPRIT,
            data,
        }
    }

    pub fn failed(seq: u32, rank: u32, code: crate::ErrorCode, culprit: u32, reason: &str) -> Self {
        let mut end = reason.len().min(crate::message::ErrorMsg::MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        GroupReply {
            seq,
            rank,
            status: code as u32,
            culprit,
            data: Bytes::copy_from_slice(&reason.as_bytes()[..end]),
        }
    }

    pub fn parse(mut p: Bytes) -> Result<Self, ProtocolError> {
        if p.len() < REPLY_HEADER_LEN {
            return Err(ProtocolError::Truncated {
                what: "group reply",
                got: p.len(),
                need: REPLY_HEADER_LEN,
            });
        }
        let r = GroupReply {
            seq: p.get_u32_le(),
            rank: p.get_u32_le(),
            status: p.get_u32_le(),
            culprit: p.get_u32_le(),
            data: p,
        };
        if r.status != 0 && std::str::from_utf8(&r.data).is_err() {
            return Err(bad("failure reason is not UTF-8"));
        }
        Ok(r)
    }

    /// The failure reason (empty for a success).
    pub fn reason(&self) -> &str {
        if self.status == 0 {
            ""
        } else {
            std::str::from_utf8(&self.data).unwrap_or("")
        }
    }

    pub fn to_frame(&self) -> Result<OutFrame, ProtocolError> {
        let mut h = [0u8; REPLY_HEADER_LEN];
        h[0..4].copy_from_slice(&self.seq.to_le_bytes());
        h[4..8].copy_from_slice(&self.rank.to_le_bytes());
        h[8..12].copy_from_slice(&self.status.to_le_bytes());
        h[12..16].copy_from_slice(&self.culprit.to_le_bytes());
        with_head(MsgType::GroupReply, h.to_vec(), &self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u32) -> Vec<GroupMember> {
        (0..n)
            .map(|r| GroupMember {
                rank: r,
                name: format!("n{r}"),
                peer: format!("127.0.0.1:{}", 4000 + r),
            })
            .collect()
    }

    #[test]
    fn control_round_trips_and_checks_members() {
        for c in [
            GroupCtl::Open {
                nodes: 4,
                topology: Some("ring".into()),
            },
            GroupCtl::Opened {
                group: 3,
                members: members(2),
                token: 9,
            },
            GroupCtl::Join {
                group: 3,
                rank: 1,
                members: members(2),
                topology: "mesh".into(),
                token: 9,
            },
            GroupCtl::Joined {
                group: 3,
                error: None,
            },
            GroupCtl::Leave { group: 3 },
            GroupCtl::Lost {
                group: 3,
                rank: 1,
                reason: "lost".into(),
            },
            GroupCtl::Close,
            GroupCtl::Closed {
                group: 3,
                reason: Some("rank 1 lost".into()),
            },
        ] {
            assert_eq!(GroupCtl::decode(&c.encode()).unwrap(), c);
        }
        assert!(GroupCtl::decode(br#"{"op":"open","nodes":0}"#).is_err());
        assert!(GroupCtl::decode(br#"{"op":"open","nodes":99999}"#).is_err());
        let mut m = members(3);
        m[2].rank = 7;
        let c = GroupCtl::Opened {
            group: 1,
            members: m,
            token: 0,
        };
        assert!(GroupCtl::decode(&c.encode()).is_err());
        let c = GroupCtl::Join {
            group: 1,
            rank: 3,
            members: members(3),
            topology: "mesh".into(),
            token: 0,
        };
        assert!(GroupCtl::decode(&c.encode()).is_err());
        assert!(GroupCtl::decode(br#"{"op":"explode"}"#).is_err());
    }

    #[test]
    fn control_is_a_json_object_not_an_array_of_its_fields() {
        assert!(GroupCtl::decode(b" \n{\"op\":\"close\"}").is_ok());
        for arr in [&br#"["open",4]"#[..], br#"["close"]"#, br#"["leave",3]"#] {
            let e = GroupCtl::decode(arr).unwrap_err();
            assert_eq!(e.kind(), "bad_group", "{}", String::from_utf8_lossy(arr));
        }
        let member = r#"{"rank":0,"name":"n-0","peer":"127.0.0.1:4000"}"#;
        let opened = |m: &str| format!(r#"{{"op":"opened","group":1,"members":[{m}]}}"#);
        assert!(GroupCtl::decode(opened(member).as_bytes()).is_ok());
        let e = GroupCtl::decode(opened(r#"[0,"n-0","127.0.0.1:4000"]"#).as_bytes()).unwrap_err();
        assert_eq!(e.kind(), "bad_group");
        let join = r#"{"op":"join","group":1,"rank":0,"topology":"mesh","members":[[0,"n-0","127.0.0.1:4000"]]}"#;
        assert!(GroupCtl::decode(join.as_bytes()).is_err());
    }

    #[test]
    fn command_round_trips() {
        let mut c = GroupCmd::new(9, ALL_RANKS, Cmd::Allreduce);
        c.algo = Some(Algo::Binomial);
        c.dtype = DType::F32;
        c.reduce = ReduceOp::Sum;
        c.a = "x".into();
        c.b = "sum".into();
        c.data = Bytes::from_static(b"abc");
        let wire = c.to_frame().unwrap().to_vec();
        assert_eq!(wire[0], 0x19);
        assert_eq!(wire.len(), 8 + CMD_HEADER_LEN + 4 + 3);
        assert_eq!(
            GroupCmd::parse(Bytes::copy_from_slice(&wire[8..])).unwrap(),
            c
        );
    }

    #[test]
    fn a_class_rides_in_the_command_byte_and_the_default_is_the_old_bytes() {
        let mut c = GroupCmd::new(4, ALL_RANKS, Cmd::Allreduce);
        c.a = "x".into();
        let old = c.to_frame().unwrap().to_vec();
        assert_eq!(old[8 + 8], 7, "class 4: the command byte alone");
        // What an older client sends parses as the default class.
        let p = GroupCmd::parse(Bytes::copy_from_slice(&old[8..])).unwrap();
        assert_eq!(p.class, DEFAULT_CLASS);
        assert_eq!(
            GroupCmd::without_class(&Bytes::copy_from_slice(&old[8..])),
            None
        );
        for class in [0, 3, 5, 7] {
            c.class = class;
            let wire = c.to_frame().unwrap().to_vec();
            assert_eq!(wire[8 + 8], (8 | class) << 4 | 7);
            let payload = Bytes::copy_from_slice(&wire[8..]);
            assert_eq!(GroupCmd::parse(payload.clone()).unwrap(), c);
            // For an older node: the same command without its class.
            let stripped = GroupCmd::without_class(&payload).unwrap();
            assert_eq!(&stripped[..], &old[8..]);
        }
        // High nibbles no sender writes are refused: 1–7, and class 4
        // spelt 8 + 4 (one encoding per class: a parsed command re-encodes
        // to the bytes it came from).
        for (byte, shown) in [(0x17, 23), (0xC7, 199)] {
            let mut q = old[8..].to_vec();
            q[8] = byte;
            let e = GroupCmd::parse(Bytes::from(q)).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("unknown group command {shown}")),
                "{e}"
            );
        }
    }

    #[test]
    fn bad_commands_are_refused() {
        let c = GroupCmd::new(1, 0, Cmd::Put);
        let wire = c.to_frame().unwrap().to_vec();
        let p = &wire[8..];
        assert!(GroupCmd::parse(Bytes::copy_from_slice(&p[..10])).is_err());
        let mut q = p.to_vec();
        q[8] = 99;
        assert!(GroupCmd::parse(Bytes::from(q)).is_err());
        let mut q = p.to_vec();
        q[20] = 5; // a name of 5 bytes that are not there
        assert!(GroupCmd::parse(Bytes::from(q)).is_err());
        let mut q = p.to_vec();
        q[20] = 1;
        q.push(0xFF); // not UTF-8
        assert!(GroupCmd::parse(Bytes::from(q)).is_err());
    }

    #[test]
    fn reply_round_trips() {
        let r = GroupReply::failed(4, 2, crate::ErrorCode::Timeout, 3, "rank 3 sent nothing");
        let wire = r.to_frame().unwrap().to_vec();
        let back = GroupReply::parse(Bytes::copy_from_slice(&wire[8..])).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.reason(), "rank 3 sent nothing");
        assert!(GroupReply::parse(Bytes::from_static(&[0; 15])).is_err());
    }
}
