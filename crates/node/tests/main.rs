//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary. A binary per file linked the whole stack once per file,
//! which was most of the test suite's build time.

mod common;
mod fabric_common;

mod chunks;
mod classes;
mod fabric;
mod failover;
mod flow;
mod group_classes;
mod group_session;
mod peer_chunks;
mod peer_classes;
mod peer_flood;
mod peer_port;
mod prop_collectives;
mod session;
