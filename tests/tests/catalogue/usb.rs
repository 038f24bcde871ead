//! `usb` scanner: being written.
