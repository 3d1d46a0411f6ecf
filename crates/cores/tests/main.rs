//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary. A binary per file linked the whole stack once per file,
//! which was most of the test suite's build time.

mod support {
    pub mod alone;
    pub mod cc;
    pub mod faulty;
}

mod core_messages;
mod fpga;
mod image;
mod in_memory_load;
mod isolation;
mod isolation_event;
mod isolation_idle_death;
mod isolation_load_death;
mod isolation_pipeline;
mod native;
mod reference_cores;
mod rtl;
mod spin;
mod spin_notify;
mod spin_pool;
mod spin_stream;
mod spin_worker;
mod zynq;
