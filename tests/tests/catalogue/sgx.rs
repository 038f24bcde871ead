//! `sgx` scanner: being written.
