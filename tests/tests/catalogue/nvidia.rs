//! `nvidia` scanner: being written.
