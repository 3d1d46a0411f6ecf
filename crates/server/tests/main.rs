//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary. A binary per file linked the whole stack once per file,
//! which was most of the test suite's build time.

mod common;

mod any_length;
mod auth;
mod chunks;
mod client_chunks;
mod config_errors;
mod config_limits;
mod direct_classes;
mod group_priority;
mod groups;
mod input_errors;
mod limits;
mod names;
mod node_chunks;
mod node_join;
mod nodes;
mod notify;
mod sharing;
mod status;
mod status_pages;
mod targets;
mod timeouts;
mod tls;
