//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary. A binary per file linked the whole stack once per file,
//! which was most of the test suite's build time.

mod common;

mod chunk_vectors;
mod doc_examples;
mod group_vectors;
mod notify_vectors;
mod peer_vectors;
mod prop_chunk;
mod prop_decoder;
mod prop_peer;
mod vectors;
