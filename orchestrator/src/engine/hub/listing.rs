//! The order lists show conversations in: each tenant's, newest activity first (a
//! participant's last event, else the creation), then by key. The publisher only marks a view
//! whose activity moved ([`Listing::mark`], an atomic flag and, the first time, a push); the
//! order is brought up to date by the next page read, and every [`FILE_EVERY`] off the async
//! threads ([`spawn_filing`]), so the writer's path pays no tree update per commit.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex};

use super::{ConvView, Hub};

/// A view's [`ConvView::listed_ms`] when the order does not hold it.
pub const NOT_LISTED: i64 = i64::MIN;

/// How often the marks are filed without a reader asking.
pub const FILE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// (tenant, activity newest first, key).
type Entry = (Arc<str>, Reverse<i64>, Arc<str>);

/// Where a page stops in the order: the last conversation it looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// Its activity time (ms).
    pub ms: i64,
    /// Its key.
    pub key: String,
}

/// What a page does with a conversation it looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Shows it.
    Take,
    /// Passes it by.
    Skip,
    /// Stops: nothing after it can match.
    End,
}

/// One page of the order.
#[derive(Debug, Default)]
pub struct Page {
    /// The conversations taken, in order, each with its place.
    pub views: Vec<(Arc<ConvView>, Position)>,
    /// Where the next page starts, when the order may hold more.
    pub next: Option<Position>,
}

/// Every tenant's conversations in list order.
#[derive(Debug, Default)]
pub struct Listing {
    order: Mutex<BTreeSet<Entry>>,
    /// Marked views, held weakly: how many hold a view says whether it may leave memory.
    pending: Mutex<Vec<std::sync::Weak<ConvView>>>,
}

fn entry(v: &ConvView, ms: i64) -> Entry {
    (
        proto_spec::tenant::tenant_of(&v.id).into(),
        Reverse(ms),
        v.id.as_str().into(),
    )
}

impl ConvView {
    /// The time lists order it by: its participants' last event, else its creation.
    pub fn activity_ms(&self) -> i64 {
        match self.last_event_ms.load(Relaxed) {
            0 => self.created_ms.load(Relaxed),
            ms => ms,
        }
    }
}

impl Listing {
    /// Notes that `view`'s activity moved (or that it is new): filed again before the next
    /// page is read.
    pub fn mark(&self, view: &Arc<ConvView>) {
        if view.relist.swap(true, AcqRel) {
            return;
        }
        // A view is marked once until filed: the list holds at most one per conversation.
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.push(Arc::downgrade(view));
    }

    /// Takes `view` out of the order for good (it left the hub).
    pub fn forget(&self, view: &ConvView) {
        view.gone.store(true, Release);
        let ms = view.listed_ms.swap(NOT_LISTED, AcqRel);
        if ms != NOT_LISTED {
            let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
            order.remove(&entry(view, ms));
        }
    }

    fn file(&self, marked: Vec<std::sync::Weak<ConvView>>) {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        for v in marked.iter().filter_map(std::sync::Weak::upgrade) {
            // Cleared first: a move after this reading marks it again.
            v.relist.store(false, Release);
            if v.gone.load(Acquire) {
                continue;
            }
            let ms = v.activity_ms();
            let old = v.listed_ms.swap(ms, AcqRel);
            if old == ms {
                continue;
            }
            if old != NOT_LISTED {
                order.remove(&entry(&v, old));
            }
            order.insert(entry(&v, ms));
        }
    }

    /// How many conversations the order holds (once brought up to date).
    pub fn len(&self) -> usize {
        self.file_pending();
        self.order.lock().map_or(0, |o| o.len())
    }

    /// Whether the order holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files every marked view.
    pub fn file_pending(&self) {
        let marked = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *pending)
        };
        if !marked.is_empty() {
            self.file(marked);
        }
    }

    /// `tenant`'s conversations after `after` in order, each shown to `visit` (with the
    /// activity time it is filed under), until `limit` are taken, `visit` ends the page, or
    /// `budget` were looked at (then the page is short and says where the next one starts).
    pub fn page(
        &self,
        hub: &Hub,
        tenant: &str,
        after: Option<&Position>,
        limit: usize,
        budget: usize,
        mut visit: impl FnMut(&Arc<ConvView>, i64) -> Visit,
    ) -> Page {
        self.file_pending();
        let tenant: Arc<str> = tenant.into();
        let start = match after {
            Some(p) => Bound::Excluded((tenant.clone(), Reverse(p.ms), p.key.as_str().into())),
            None => Bound::Included((tenant.clone(), Reverse(i64::MAX), "".into())),
        };
        let order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let mut page = Page::default();
        let mut last = None;
        for (looked, (t, Reverse(ms), key)) in order.range((start, Bound::Unbounded)).enumerate() {
            if *t != tenant {
                break;
            }
            if looked == budget || page.views.len() == limit {
                // More follow: the next page starts after the last one looked at.
                page.next = last;
                return page;
            }
            let here = Position {
                ms: *ms,
                key: key.to_string(),
            };
            last = Some(here.clone());
            let Some(view) = hub.get(key) else { continue };
            match visit(&view, *ms) {
                Visit::Take => page.views.push((view, here)),
                Visit::Skip => {}
                Visit::End => return page,
            }
        }
        page
    }
}

/// Every [`FILE_EVERY`], until the server stops: files the marks on a blocking thread, so
/// that a page read seldom has many to file.
pub(crate) fn spawn_filing(hub: &Arc<Hub>) {
    let hub = hub.clone();
    let mut closing = hub.closing();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FILE_EVERY) => {}
                _ = closing.wait_for(|c| *c) => return,
            }
            let hub = hub.clone();
            let _ = tokio::task::spawn_blocking(move || hub.listing().file_pending()).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::ConvMachine;

    fn view(hub: &Hub, id: &str, ms: i64) -> Arc<ConvView> {
        let v = hub.insert(id, vec!["a".into()], ConvMachine::new(id, vec![]).core);
        v.set_clock(ms, ms);
        hub.listing().mark(&v);
        v
    }

    #[test]
    fn pages_go_newest_first_within_a_tenant_and_follow_moves() {
        let hub = Hub::default();
        for (id, ms) in [("c1", 10), ("c2", 30), ("c3", 20), ("acme/c1", 40)] {
            view(&hub, id, ms);
        }
        let ids = |p: &Page| {
            p.views
                .iter()
                .map(|(v, _)| v.id.clone())
                .collect::<Vec<_>>()
        };
        let first = hub
            .listing()
            .page(&hub, "default", None, 2, 100, |_, _| Visit::Take);
        assert_eq!(ids(&first), ["c2", "c3"]);
        let next = first.next.clone().expect("more");
        let second = hub
            .listing()
            .page(&hub, "default", Some(&next), 2, 100, |_, _| Visit::Take);
        assert_eq!(ids(&second), ["c1"]);
        assert_eq!(second.next, None);
        let acme = hub
            .listing()
            .page(&hub, "acme", None, 10, 100, |_, _| Visit::Take);
        assert_eq!(ids(&acme), ["acme/c1"]);
        // c1 moves to the front; a forgotten one leaves.
        let c1 = hub.get("c1").unwrap();
        c1.set_clock(0, 50);
        hub.listing().mark(&c1);
        hub.remove("c3");
        let all = hub
            .listing()
            .page(&hub, "default", None, 10, 100, |_, _| Visit::Take);
        assert_eq!(ids(&all), ["c1", "c2"]);
        // A budget: a short page that says where to go on.
        let short = hub
            .listing()
            .page(&hub, "default", None, 10, 1, |_, _| Visit::Skip);
        assert!(short.views.is_empty());
        assert_eq!(short.next.map(|p| p.key), Some("c1".to_string()));
    }
}
