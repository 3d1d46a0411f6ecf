//! The status extension (type 0x13 request, 0x14 answer): one description of
//! what the server is doing — its nodes and its users — that a hello user
//! with the `status` feature can ask for at any time. Tests ask it instead of
//! sleeping or reading logs; `corefarm status` prints it; later the metrics
//! endpoint serves the same structure. JSON, so fields can be added without a
//! new message type; unknown fields are ignored on decode.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;
use crate::header::MsgType;
use crate::outframe::OutFrame;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The asking user's id (as it appears in `users` and `NodeStatus::user`).
    #[serde(default)]
    pub you: Option<u64>,
    /// Dispatch policy: "queue", "stack" or "credit".
    #[serde(default)]
    pub policy: String,
    #[serde(default)]
    pub max_message: u32,
    #[serde(default)]
    pub nodes: Vec<NodeStatus>,
    #[serde(default)]
    pub users: Vec<UserStatus>,
    /// `--sharing`: "exclusive" (a user owns its nodes) or "shared"
    /// (nodes hold functions); empty from servers before sharing existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sharing: String,
    /// Shared mode: the functions the server knows (seed 002).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<FunctionStatus>,
    /// Seconds since the server started.
    #[serde(default)]
    pub uptime_seconds: f64,
    /// Data messages moved to another node after their node was lost.
    #[serde(default)]
    pub redispatched: u64,
    /// Late messages copied to a second node (hedging), and the answers of
    /// such copies dropped because the other copy answered first.
    #[serde(default)]
    pub hedged: u64,
    #[serde(default)]
    pub hedge_duplicates: u64,
    /// Errors since the server started, by kind (`node_lost`,
    /// `core_failure`, `configuration_failed`, `user_error`, `refused`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Bytes read and written on each kind of link since the server started.
    #[serde(default)]
    pub bytes: LinkBytes,
    /// Every connected node counted by state, whatever `nodes` lists (a
    /// request may ask for one page of them, [`StatusQuery`]); none from
    /// servers before pages existed, whose `nodes` lists every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_counts: Option<NodeCounts>,
    /// What each user (tenant) used since the server started, all its
    /// sessions together; none from servers before accounting existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<AccountStatus>,
}

/// One user's (tenant's) account: its share and limits from the auth
/// file, and what its sessions used since the server started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AccountStatus {
    /// The user's name (`[users.<name>]`, or the hello's `user` on a
    /// server without an auth file); `anonymous` for users that name none.
    pub user: String,
    /// Its share of node time against the other active users.
    #[serde(default)]
    pub weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_bytes: Option<u64>,
    /// Sessions it opened, and of those open now.
    #[serde(default)]
    pub sessions: u64,
    #[serde(default)]
    pub active: u64,
    /// Node time its messages took: a node's busy time, each stretch
    /// between two of its answers charged to the user answered; and its
    /// groups' members for as long as each group held them.
    #[serde(default)]
    pub node_seconds: f64,
    /// Inputs of the results delivered to it.
    #[serde(default)]
    pub inputs: u64,
    /// Bytes read from and written to its sessions' links.
    #[serde(default)]
    pub bytes_in: u64,
    #[serde(default)]
    pub bytes_out: u64,
    /// Node programmings made for its work (one shared among the users of
    /// the function loaded, so it may be a fraction).
    #[serde(default)]
    pub reconfigurations: f64,
    /// Bytes of its inputs accepted and not yet answered now, all its
    /// sessions together (what `max_queued_bytes` bounds).
    #[serde(default)]
    pub queued_bytes: u64,
}

/// Connected nodes by state: the summary a large cluster's status gives
/// without a row per node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCounts {
    #[serde(default)]
    pub total: u64,
    #[serde(default)]
    pub free: u64,
    #[serde(default)]
    pub assigned: u64,
    #[serde(default)]
    pub configuring: u64,
    #[serde(default)]
    pub ready: u64,
}

impl NodeCounts {
    pub fn get(&self, s: NodeState) -> u64 {
        match s {
            NodeState::Free => self.free,
            NodeState::Assigned => self.assigned,
            NodeState::Configuring => self.configuring,
            NodeState::Ready => self.ready,
        }
    }

    pub fn add(&mut self, s: NodeState) {
        self.total += 1;
        *match s {
            NodeState::Free => &mut self.free,
            NodeState::Assigned => &mut self.assigned,
            NodeState::Configuring => &mut self.configuring,
            NodeState::Ready => &mut self.ready,
        } += 1;
    }
}

/// What a status request asks for (its payload, JSON; an empty payload
/// asks for every node, as before pages existed). A server of tens of
/// thousands of nodes answers a page in the time and size of a small one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusQuery {
    /// Which node rows to list: `None` every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodePage>,
}

/// A page of node rows in id order: those in `state` (all when `None`),
/// `limit` of them from the `offset`-th on (`limit` 0: none, the summary
/// alone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePage {
    #[serde(default)]
    pub offset: u64,
    #[serde(default)]
    pub limit: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<NodeState>,
}

impl NodePage {
    /// Whether the `index`-th node of the page's state (counted from 0) is on it.
    pub fn holds(&self, index: u64) -> bool {
        index >= self.offset && index - self.offset < self.limit
    }
}

impl StatusQuery {
    /// Every node (the empty request).
    pub fn all() -> Self {
        StatusQuery::default()
    }

    /// The summary and no node rows.
    pub fn summary() -> Self {
        StatusQuery {
            nodes: Some(NodePage::default()),
        }
    }

    /// A request's payload: empty asks for everything.
    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        if payload.is_empty() {
            return Ok(StatusQuery::all());
        }
        if payload.len() > MAX_QUERY || !crate::hello::is_json_object(payload) {
            return Err(ProtocolError::BadStatus(
                "a status request's payload is a small JSON object".into(),
            ));
        }
        serde_json::from_slice(payload).map_err(|e| ProtocolError::BadStatus(e.to_string()))
    }

    /// The request frame: empty for [`StatusQuery::all`], so that servers
    /// from before pages existed answer it too.
    pub fn to_frame(&self) -> OutFrame {
        let payload = match self.nodes {
            None => Bytes::new(),
            Some(_) => Bytes::from(serde_json::to_vec(self).expect("query serialises")),
        };
        OutFrame::small(MsgType::StatusRequest, &[], payload)
    }
}

/// Largest status request payload a server reads.
pub const MAX_QUERY: usize = 1024;

/// One function in shared mode: a configuration payload, by digest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionStatus {
    /// Short hex of the payload's SHA-256: the function's identity.
    pub id: String,
    /// How users know it: the image's name with the SHA-256 of its
    /// bitstream (`vadd (sha256:5b05cb74bb3d)`), `bench`, or the
    /// bitstream's digest alone; none from servers before names existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Nodes holding it and taking data.
    #[serde(default)]
    pub replicas: u32,
    /// Nodes being configured for it.
    #[serde(default)]
    pub loading: u32,
    /// Data messages waiting in its queue.
    #[serde(default)]
    pub queued: u64,
    /// Data messages at its replicas.
    #[serde(default)]
    pub in_flight: u64,
    /// Demand over the last monitoring period, node-seconds.
    #[serde(default)]
    pub demand: f64,
    /// Measured node time per input, microseconds (none before the first result).
    #[serde(default)]
    pub service_us: Option<f64>,
    /// Times a node was configured for it.
    #[serde(default)]
    pub reconfigurations: u64,
    /// Users whose current configuration it is.
    #[serde(default)]
    pub users: Vec<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkBytes {
    #[serde(default)]
    pub user_in: u64,
    #[serde(default)]
    pub user_out: u64,
    #[serde(default)]
    pub node_in: u64,
    #[serde(default)]
    pub node_out: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// In the pool, assigned to nobody.
    #[default]
    Free,
    /// Assigned to a user, not configured yet.
    Assigned,
    /// A configuration was sent, no response yet.
    Configuring,
    /// Configured and taking data.
    Ready,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: u64,
    #[serde(default)]
    pub name: Option<String>,
    pub addr: String,
    /// Configuration targets it announced in its hello (e.g.
    /// `native-x86_64-linux`); empty for a seed-format node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    #[serde(default)]
    pub state: NodeState,
    /// The user it is assigned to, if any.
    #[serde(default)]
    pub user: Option<u64>,
    /// Data messages sent to it and not answered yet.
    #[serde(default)]
    pub in_flight: u64,
    /// Results it returned (for its current user).
    #[serde(default)]
    pub results: u64,
    /// What it is configured for (in shared mode: holds or loads): `bench`,
    /// the image's name with the start of its SHA-256 (`vadd
    /// (sha256:5b05cb74bb3d)`), or `sha256:<12 hex>` of a raw bitstream;
    /// none while unconfigured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Cores in its current configuration.
    #[serde(default)]
    pub cores: u32,
    /// Seconds with at least one message in flight, since it connected
    /// (its utilisation is the rate of this).
    #[serde(default)]
    pub busy_seconds: f64,
    /// Results since it connected, whoever it worked for.
    #[serde(default)]
    pub results_total: u64,
    /// Inputs its cores failed on since it connected.
    #[serde(default)]
    pub failures: u64,
    /// Configurations it accepted since it connected.
    #[serde(default)]
    pub reconfigurations: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserPhase {
    /// Connected, no configuration yet (seed 000 §3.3.1 "Initial").
    #[default]
    Initial,
    /// Nodes are being configured.
    Configuring,
    /// Data routing.
    Routing,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserStatus {
    pub id: u64,
    pub addr: String,
    #[serde(default)]
    pub name: Option<String>,
    /// Whether it opened with a hello (false: a seed-format user).
    #[serde(default)]
    pub hello: bool,
    #[serde(default)]
    pub phase: UserPhase,
    /// Ids of the nodes assigned to it; in shared mode, where nodes are
    /// nobody's, those holding or loading its function.
    #[serde(default)]
    pub nodes: Vec<u64>,
    /// Data messages accepted and not yet answered (the seed's data counter).
    #[serde(default)]
    pub outstanding: u64,
    /// Of those, waiting in the server for a node.
    #[serde(default)]
    pub queued: u64,
    /// Results delivered to it.
    #[serde(default)]
    pub results: u64,
    /// Its function, named as [`NodeStatus::function`] is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Shared mode: its data messages at nodes now.
    #[serde(default)]
    pub in_flight: u64,
    /// Inputs a core failed on (answered with an error).
    #[serde(default)]
    pub failures: u64,
    /// The user (tenant) it acts for: its [`AccountStatus::user`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Median and 99th percentile, in seconds, of the time from the server
    /// handing a message to a node to its result (bucket estimates); in
    /// shared mode from the server admitting it, queueing included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99: Option<f64>,
}

/// Largest status answer a reader accepts: a cluster of thousands of nodes
/// fits well within it.
pub const MAX_STATUS: usize = 16 * 1024 * 1024;

impl ClusterStatus {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("status serialises")
    }

    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        if payload.len() > MAX_STATUS {
            return Err(ProtocolError::BadStatus(format!(
                "{} bytes is over the {MAX_STATUS}-byte limit",
                payload.len()
            )));
        }
        if !crate::hello::is_json_object(payload) {
            return Err(ProtocolError::BadStatus("not a JSON object".into()));
        }
        serde_json::from_slice(payload).map_err(|e| ProtocolError::BadStatus(e.to_string()))
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::small(MsgType::Status, &[], Bytes::from(self.encode()))
    }

    /// The (empty) request.
    pub fn request_frame() -> OutFrame {
        OutFrame::small(MsgType::StatusRequest, &[], Bytes::new())
    }

    pub fn node(&self, id: u64) -> Option<&NodeStatus> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub fn user(&self, id: u64) -> Option<&UserStatus> {
        self.users.iter().find(|u| u.id == id)
    }

    /// A function by (a prefix of) its short id.
    pub fn function(&self, id: &str) -> Option<&FunctionStatus> {
        self.functions
            .iter()
            .find(|f| f.id.starts_with(id) || id.starts_with(&f.id))
    }

    /// A user's account by name.
    pub fn account(&self, user: &str) -> Option<&AccountStatus> {
        self.accounts.iter().find(|a| a.user == user)
    }

    /// Nodes in the given state: from the counts where the server sent
    /// them (its `nodes` may be one page), else the rows.
    pub fn count_nodes(&self, state: NodeState) -> usize {
        if let Some(c) = &self.node_counts {
            return c.get(state) as usize;
        }
        self.nodes.iter().filter(|n| n.state == state).count()
    }

    /// Connected nodes: from the counts where the server sent them.
    pub fn node_total(&self) -> usize {
        self.node_counts
            .map_or(self.nodes.len(), |c| c.total as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_unknown_fields() {
        let s = ClusterStatus {
            you: Some(3),
            policy: "credit".into(),
            max_message: 1024,
            nodes: vec![NodeStatus {
                id: 1,
                addr: "127.0.0.1:5".into(),
                state: NodeState::Ready,
                user: Some(3),
                ..Default::default()
            }],
            users: vec![UserStatus {
                id: 3,
                addr: "127.0.0.1:6".into(),
                phase: UserPhase::Routing,
                nodes: vec![1],
                latency_p50: Some(0.001),
                function: Some("0a1b2c3d4e5f".into()),
                ..Default::default()
            }],
            sharing: "shared".into(),
            functions: vec![FunctionStatus {
                id: "0a1b2c3d4e5f".into(),
                replicas: 1,
                service_us: Some(12.5),
                users: vec![3],
                ..Default::default()
            }],
            redispatched: 2,
            ..Default::default()
        };
        assert_eq!(s.function("0a1b").map(|f| f.replicas), Some(1));
        assert_eq!(ClusterStatus::decode(&s.encode()).unwrap(), s);
        let later = br#"{"nodes":[{"id":1,"addr":"x","state":"free","future":1}],"functions":[]}"#;
        let d = ClusterStatus::decode(later).unwrap();
        assert_eq!(d.count_nodes(NodeState::Free), 1);
        // An object, not an array of the fields in declaration order.
        let e = ClusterStatus::decode(br#"[3,"queue",1024,[],[]]"#).unwrap_err();
        assert_eq!(e.kind(), "bad_status");
        assert!(ClusterStatus::decode(b"{").is_err());
    }

    #[test]
    fn queries_round_trip_and_the_full_one_is_the_empty_request() {
        assert_eq!(
            StatusQuery::all().to_frame().to_vec(),
            ClusterStatus::request_frame().to_vec()
        );
        assert_eq!(StatusQuery::decode(&[]).unwrap(), StatusQuery::all());
        let q = StatusQuery {
            nodes: Some(NodePage {
                offset: 20,
                limit: 10,
                state: Some(NodeState::Ready),
            }),
        };
        let frame = q.to_frame().to_vec();
        assert_eq!(StatusQuery::decode(&frame[8..]).unwrap(), q);
        let page = q.nodes.unwrap();
        assert!(!page.holds(19) && page.holds(20) && page.holds(29) && !page.holds(30));
        assert!(
            !NodePage::default().holds(0),
            "limit 0 is the summary alone"
        );
        assert_eq!(
            StatusQuery::decode(b"[1]").unwrap_err().kind(),
            "bad_status"
        );
        let long = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_QUERY));
        assert!(StatusQuery::decode(long.as_bytes()).is_err());
    }

    #[test]
    fn counts_say_how_many_nodes_a_page_leaves_out() {
        let mut c = NodeCounts::default();
        for s in [NodeState::Free, NodeState::Free, NodeState::Ready] {
            c.add(s);
        }
        let s = ClusterStatus {
            node_counts: Some(c),
            ..Default::default()
        };
        assert_eq!((s.node_total(), s.count_nodes(NodeState::Free)), (3, 2));
        assert_eq!(s.count_nodes(NodeState::Ready), 1);
    }

    #[test]
    fn request_is_an_empty_frame() {
        assert_eq!(
            ClusterStatus::request_frame().to_vec(),
            [0x13, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}
