//! `serial` scanner: being written.
