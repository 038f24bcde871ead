//! `dlb` scanner: being written.
