//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary. A binary per file linked the whole stack once per file,
//! which was most of the test suite's build time.

mod echo_in_process;
mod fault_proxy;
mod user_fake_server;
