//! `idxd` scanner: being written.
