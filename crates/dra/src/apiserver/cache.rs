//! What the API server holds of one node's slices of a driver, as far as the watch and the
//! publisher's own writes tell: the publisher compares the slices it wants with this, so a pass
//! reads nothing from the API server and writes only what differs.
//!
//! Two sources meet here, and either can be behind the other. The watch delivers the
//! publisher's own writes some time after the write answered (an echo), and a list or event
//! from before a write can arrive after it. As the upstream ResourceSlice controller does
//! (client-go's integer resource-version mutation cache), an object is replaced only by a newer
//! resourceVersion, compared as integers (what the API server's etcd storage hands out;
//! `resourceVersion`s that are not integers are taken as they come). A slice this publisher
//! deleted is remembered until the watch confirms the deletion, so an older event cannot bring
//! it back.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::{SliceList, WatchEvent};

/// The node's slices, by name.
#[derive(Clone, Debug, Default)]
pub struct SliceCache {
    slices: BTreeMap<String, ResourceSlice>,
    /// Slices this publisher deleted, with the resourceVersion they had then.
    deleted: BTreeMap<String, Option<u64>>,
}

fn name(slice: &ResourceSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

fn version(slice: &ResourceSlice) -> Option<u64> {
    slice.metadata.resource_version.as_deref()?.parse().ok()
}

/// Whether `news` is older than or as old as `held` (both known): then it changes nothing.
fn stale(news: Option<u64>, held: Option<u64>) -> bool {
    matches!((news, held), (Some(n), Some(h)) if n <= h)
}

impl SliceCache {
    /// The cache a list gives.
    pub fn from_list(list: SliceList) -> Self {
        let mut cache = Self::default();
        cache.listed(list);
        cache
    }

    /// The slices as last known, by name.
    pub fn slices(&self) -> &BTreeMap<String, ResourceSlice> {
        &self.slices
    }

    /// A (re-)list: the API server's state at the list's resourceVersion, which replaces what
    /// was known, except for this publisher's writes that came after it.
    pub fn listed(&mut self, list: SliceList) {
        let at: Option<u64> = list.resource_version.parse().ok();
        let mut slices: BTreeMap<String, ResourceSlice> =
            list.items.into_iter().map(|s| (name(&s), s)).collect();
        for (name, held) in std::mem::take(&mut self.slices) {
            if matches!((version(&held), at), (Some(h), Some(l)) if h > l) {
                slices.insert(name, held);
            }
        }
        self.deleted.retain(|name, gone| match slices.get(name) {
            Some(listed) if stale(version(listed), *gone) || gone.is_none() => {
                slices.remove(name);
                true
            }
            _ => false,
        });
        self.slices = slices;
    }

    /// One watch event; whether it changed what is known (the echo of this publisher's own
    /// write, already known from its answer, does not).
    pub fn observed(&mut self, event: &WatchEvent) -> bool {
        match event {
            WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                let name = name(s);
                let news = version(s);
                if self
                    .slices
                    .get(&name)
                    .is_some_and(|h| stale(news, version(h)))
                {
                    return false;
                }
                if let Some(gone) = self.deleted.get(&name)
                    && (stale(news, *gone) || gone.is_none())
                {
                    return false;
                }
                self.deleted.remove(&name);
                self.slices.insert(name, s.clone());
                true
            }
            WatchEvent::Deleted(s) => {
                let name = name(s);
                if self
                    .slices
                    .get(&name)
                    .is_some_and(|h| stale(version(s), version(h)))
                {
                    return false;
                }
                self.deleted.remove(&name);
                self.slices.remove(&name).is_some()
            }
            WatchEvent::Bookmark(_) => false,
        }
    }

    /// This publisher created or updated a slice: the API server's answer.
    pub fn wrote(&mut self, slice: ResourceSlice) {
        let name = name(&slice);
        self.deleted.remove(&name);
        self.slices.insert(name, slice);
    }

    /// This publisher deleted the slice `name` (or found it gone).
    pub fn removed(&mut self, name: &str) {
        if let Some(held) = self.slices.remove(name) {
            self.deleted.insert(name.to_owned(), version(&held));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(name: &str, version: u64, devices: usize) -> ResourceSlice {
        let mut s = crate::testing::slice(name, "node-1", "gpu.example.com", devices);
        s.metadata.resource_version = Some(version.to_string());
        s
    }

    fn devices(cache: &SliceCache, name: &str) -> Option<usize> {
        cache
            .slices()
            .get(name)
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
    }

    #[test]
    fn older_news_never_replaces_newer() {
        let mut cache = SliceCache::from_list(SliceList {
            items: vec![at("a", 3, 1)],
            resource_version: "5".into(),
        });
        // Own update answered at 7; the watch then brings an older change and the echo.
        cache.wrote(at("a", 7, 2));
        assert!(!cache.observed(&WatchEvent::Modified(at("a", 6, 3))));
        assert_eq!(devices(&cache, "a"), Some(2));
        assert!(
            !cache.observed(&WatchEvent::Modified(at("a", 7, 2))),
            "the echo"
        );
        assert_eq!(devices(&cache, "a"), Some(2));
        // Someone else changes it later: taken.
        assert!(cache.observed(&WatchEvent::Modified(at("a", 9, 4))));
        assert_eq!(devices(&cache, "a"), Some(4));
        // A list taken before an own write keeps the write.
        cache.wrote(at("b", 12, 1));
        cache.listed(SliceList {
            items: vec![at("a", 9, 4)],
            resource_version: "10".into(),
        });
        assert_eq!(devices(&cache, "b"), Some(1));
        // A list taken after it without it: gone (someone deleted it).
        cache.listed(SliceList {
            items: vec![at("a", 9, 4)],
            resource_version: "13".into(),
        });
        assert_eq!(devices(&cache, "b"), None);

        // Own delete: an older event does not bring it back, a newer creation does.
        cache.removed("a");
        let _ = cache.observed(&WatchEvent::Modified(at("a", 9, 4)));
        assert_eq!(devices(&cache, "a"), None);
        cache.listed(SliceList {
            items: vec![at("a", 9, 4)],
            resource_version: "13".into(),
        });
        assert_eq!(devices(&cache, "a"), None, "a list from before the delete");
        let _ = cache.observed(&WatchEvent::Deleted(at("a", 14, 4)));
        let _ = cache.observed(&WatchEvent::Added(at("a", 15, 5)));
        assert_eq!(devices(&cache, "a"), Some(5));
        // A deletion older than what is held is not applied; a newer one is.
        let _ = cache.observed(&WatchEvent::Deleted(at("a", 11, 5)));
        assert_eq!(devices(&cache, "a"), Some(5));
        let _ = cache.observed(&WatchEvent::Deleted(at("a", 16, 5)));
        assert_eq!(devices(&cache, "a"), None);
    }
}
