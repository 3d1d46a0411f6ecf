//! corefarm node (work in progress)
