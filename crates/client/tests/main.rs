//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary, which links the client once instead of once per file.

mod support;

mod group_tls;
mod real_server;
mod resume_real;
