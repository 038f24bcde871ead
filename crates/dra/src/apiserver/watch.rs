//! Following the node's ResourceSlices of one driver through list and watch, as informers do:
//! list once, watch from the list's resourceVersion, resume a watch that ended from the last
//! resourceVersion seen (an event's or a bookmark's), and list again when the API server says
//! that version is gone (410: its history was compacted past it).
//!
//! Why the publisher follows the slices at all: kubelet deletes a node's slices when it starts
//! and a driver's 30 s after the driver became unusable, and an administrator or another writer
//! may change them. A watch shows that within milliseconds, where a re-list on a timer would
//! leave the scheduler without the node's devices until the next resync.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;

use super::{ApiError, SliceStore, WatchEvent, WatchStream};

/// The first pause after a failed list or watch; doubled on each failure in a row.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// A watch that ends within this without an event is taken for a failure.
const QUICK_END: Duration = Duration::from_secs(1);

/// What the watcher saw.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// A (re-)list: every selected slice as it is now. Events between the last one seen and
    /// this list may have been missed, so this replaces what was known.
    Listed(Vec<ResourceSlice>),
    /// One change (never a bookmark: those only move the resume point); boxed, a slice is large.
    Changed(Box<WatchEvent>),
}

/// Follows the slices with `spec.nodeName == node` and `spec.driver == driver`.
pub struct SliceWatcher<S> {
    store: S,
    node: String,
    driver: String,
    /// Where the next watch starts; `None`: list first.
    version: Option<String>,
    stream: Option<WatchStream>,
    /// When the open watch started, until its first event: a watch that ends at once is
    /// retried after a pause, not in a tight loop.
    started: Option<tokio::time::Instant>,
    pause: Duration,
    lists: u64,
}

impl<S: SliceStore> SliceWatcher<S> {
    /// A watcher that lists at its first [`SliceWatcher::next`].
    pub fn new(store: S, node: impl Into<String>, driver: impl Into<String>) -> Self {
        Self {
            store,
            node: node.into(),
            driver: driver.into(),
            version: None,
            stream: None,
            started: None,
            pause: FIRST_PAUSE,
            lists: 0,
        }
    }

    /// How many lists it made (the first, and one after each 410).
    pub fn lists(&self) -> u64 {
        self.lists
    }

    /// The resourceVersion the next watch starts from.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// Waits after a failure, longer each time in a row.
    async fn backoff(&mut self, error: &ApiError) {
        tracing::warn!(node = %self.node, driver = %self.driver, %error, pause = ?self.pause, "ResourceSlice watch failed; retrying");
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
    }

    /// The next observation; it never gives up (failures are logged and retried with backoff).
    /// Cancel-safe: dropped between events, the next call resumes where this one was.
    pub async fn next(&mut self) -> Observation {
        loop {
            let Some(version) = self.version.clone() else {
                match self.store.list_at(&self.node, &self.driver).await {
                    Ok(list) => {
                        self.lists += 1;
                        self.version = Some(list.resource_version);
                        self.pause = FIRST_PAUSE;
                        return Observation::Listed(list.items);
                    }
                    Err(e) => {
                        self.backoff(&e).await;
                        continue;
                    }
                }
            };
            let stream = match &mut self.stream {
                Some(stream) => stream,
                None => match self.store.watch(&self.node, &self.driver, &version).await {
                    Ok(stream) => {
                        self.started = Some(tokio::time::Instant::now());
                        self.stream.insert(stream)
                    }
                    Err(ApiError::Gone(why)) => {
                        tracing::info!(node = %self.node, driver = %self.driver, %why, "watch history gone; listing again");
                        self.version = None;
                        continue;
                    }
                    Err(e) => {
                        self.backoff(&e).await;
                        continue;
                    }
                },
            };
            match stream.next().await {
                Some(Ok(event)) => {
                    self.pause = FIRST_PAUSE;
                    self.started = None;
                    if let Some(v) = event.resource_version() {
                        self.version = Some(v.to_owned());
                    }
                    if !matches!(event, WatchEvent::Bookmark(_)) {
                        return Observation::Changed(Box::new(event));
                    }
                }
                Some(Err(ApiError::Gone(why))) => {
                    tracing::info!(node = %self.node, driver = %self.driver, %why, "watch history gone; listing again");
                    self.stream = None;
                    self.version = None;
                }
                Some(Err(e)) => {
                    self.stream = None;
                    self.backoff(&e).await;
                }
                // The API server ended the watch (its timeout): resume where it was; at once
                // unless it ended as soon as it began.
                None => {
                    self.stream = None;
                    if self
                        .started
                        .take()
                        .is_some_and(|at| at.elapsed() < QUICK_END)
                    {
                        let ended = ApiError::Transport("the watch ended at once".into());
                        self.backoff(&ended).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::standin::{ApiServerStandIn, Options};

    const DRIVER: &str = "gpu.example.com";

    /// A slice of `driver` on node-1, without devices.
    fn slice(name: &str, driver: &str) -> ResourceSlice {
        crate::testing::slice(name, "node-1", driver, 0)
    }

    fn names(seen: &Observation) -> (String, Vec<String>) {
        let name = |s: &ResourceSlice| s.metadata.name.clone().unwrap_or_default();
        let event = match seen {
            Observation::Listed(items) => {
                return ("listed".into(), items.iter().map(name).collect());
            }
            Observation::Changed(event) => event.as_ref(),
        };
        match event {
            WatchEvent::Added(s) => ("added".into(), vec![name(s)]),
            WatchEvent::Modified(s) => ("modified".into(), vec![name(s)]),
            WatchEvent::Deleted(s) => ("deleted".into(), vec![name(s)]),
            WatchEvent::Bookmark(v) => ("bookmark".into(), vec![v.clone()]),
        }
    }

    #[tokio::test]
    async fn a_watch_resumes_and_lists_again_after_410() {
        let server = ApiServerStandIn::start().await.unwrap();
        server.put_slice(slice("a", DRIVER)).unwrap();
        let mut watcher = SliceWatcher::new(server.client(), "node-1", DRIVER);
        assert_eq!(
            names(&watcher.next().await),
            ("listed".into(), vec!["a".into()])
        );

        // Changes of this driver on this node arrive in order; another driver's do not.
        server.put_slice(slice("other", "nic.example.com")).unwrap();
        server.put_slice(slice("b", DRIVER)).unwrap();
        server.wipe_slices(Some("node-1"), Some(DRIVER));
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(names(&watcher.next().await));
        }
        assert_eq!(
            seen,
            [
                ("added".into(), vec!["b".into()]),
                ("deleted".into(), vec!["a".into()]),
                ("deleted".into(), vec!["b".into()]),
            ]
        );

        // The watch ends (the server's timeout) while a slice is created: the next watch starts
        // from the last resourceVersion seen and misses nothing, without a list.
        server.end_watches();
        server.put_slice(slice("c", DRIVER)).unwrap();
        assert_eq!(
            names(&watcher.next().await),
            ("added".into(), vec!["c".into()])
        );
        assert_eq!(watcher.lists(), 1);
        assert!(server.watches() >= 2);

        // The history is compacted past the watcher's version while no watch is open: 410 Gone,
        // and a fresh list shows what happened meanwhile.
        server.end_watches();
        server.wipe_slices(None, Some(DRIVER));
        server.compact();
        assert_eq!(names(&watcher.next().await), ("listed".into(), vec![]));
        assert_eq!(watcher.lists(), 2);
    }

    #[tokio::test]
    async fn bookmarks_move_the_resume_point_past_a_compaction() {
        let server = ApiServerStandIn::start_with(Options {
            bookmarks: Some(Duration::from_millis(20)),
            ..Options::default()
        })
        .await
        .unwrap();
        let mut watcher = SliceWatcher::new(server.client(), "node-1", DRIVER);
        assert_eq!(names(&watcher.next().await), ("listed".into(), vec![]));
        let listed_at = watcher.version().unwrap().to_owned();
        // Another driver's writes move the collection's version; the watch shows none of them,
        // only bookmarks with the newer version.
        for i in 0..3 {
            server
                .put_slice(slice(&format!("nic-{i}"), "nic.example.com"))
                .unwrap();
        }
        let now = server.resource_version();
        assert_ne!(now, listed_at);
        // Until a bookmark has come (every 20 ms, later on a loaded machine), nothing else does.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while watcher.version() != Some(now.as_str()) {
            assert!(tokio::time::Instant::now() < deadline, "no bookmark");
            let waited = tokio::time::timeout(Duration::from_millis(50), watcher.next()).await;
            assert!(waited.is_err(), "no change of this driver: {waited:?}");
        }
        // Compacted at the bookmarked version: resuming from it is no 410, so no new list.
        server.compact();
        server.end_watches();
        server.put_slice(slice("a", DRIVER)).unwrap();
        assert_eq!(
            names(&watcher.next().await),
            ("added".into(), vec!["a".into()])
        );
        assert_eq!(watcher.lists(), 1);
    }
}
