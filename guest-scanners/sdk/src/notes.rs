//! Messages printed once per episode.
//!
//! Why: a scanner that finds something wrong with a device (a VF bound to the wrong driver, a
//! missing node) finds it again on every scan; printing it every time floods the host's log
//! (which rate-limits guest output, so the flood would also hide other lines). A note is printed
//! when it appears, not while every following scan repeats it, and again if it comes back after a
//! scan without it.

use std::collections::BTreeSet;

use crate::DeviceTree;

/// One scan's tree and a note for each device it left out or described with a fallback: what
/// a scan function that can meet broken devices returns, so that its tests see the notes and
/// its loop prints them through [`Notes`] before handing the tree on.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scanned {
    /// The devices found.
    pub tree: DeviceTree,
    /// What was wrong, one line a device, in scan order.
    pub notes: Vec<String>,
}

/// The notes of the last scan.
#[derive(Debug, Default, Clone)]
pub struct Notes {
    last: BTreeSet<String>,
}

impl Notes {
    /// No note printed yet: keep one across the scans of a scanner's loop.
    pub fn new() -> Self {
        Self::default()
    }

    /// The notes of `now` that the previous scan did not have (and remembers `now`).
    pub fn fresh(&mut self, now: Vec<String>) -> Vec<String> {
        let new = now
            .iter()
            .filter(|n| !self.last.contains(*n))
            .cloned()
            .collect();
        self.last = now.into_iter().collect();
        new
    }

    /// Prints [`Notes::fresh`] to stderr, where the host logs it under the scanner's name.
    pub fn print(&mut self, now: Vec<String>) {
        for note in self.fresh(now) {
            eprintln!("{note}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_episode() {
        let mut n = Notes::new();
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(n.fresh(v(&["a", "b"])), ["a", "b"]);
        assert!(n.fresh(v(&["a", "b"])).is_empty());
        assert_eq!(n.fresh(v(&["b", "c"])), ["c"]);
        assert!(n.fresh(v(&[])).is_empty());
        assert_eq!(n.fresh(v(&["a"])), ["a"], "back after a scan without it");
    }
}
