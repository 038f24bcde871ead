//! `gpu` scanner: being written.
