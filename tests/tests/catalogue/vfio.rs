//! `vfio` scanner: being written.
