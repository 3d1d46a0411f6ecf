//! corefarm bench (work in progress)
