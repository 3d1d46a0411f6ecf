//! A core worker executable for tests of this crate (a node uses its own
//! executable: `corefarm __core-worker`). See `corefarm_cores::worker`.

fn main() {
    corefarm_cores::worker::main()
}
