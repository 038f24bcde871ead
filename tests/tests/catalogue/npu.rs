//! `npu` scanner: being written.
