//! `qat` scanner: being written.
