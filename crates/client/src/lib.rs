//! corefarm client (work in progress)
