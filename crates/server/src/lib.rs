//! corefarm server (work in progress)
