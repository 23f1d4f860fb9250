//! The closed conversations a shared store keeps and this node does not hold, in a list: read
//! from the database a chunk at a time in list order ([`Store::closed_page`]), narrowed by
//! their rows, merged with the node's own order, and taken in (loaded) only once a page shows
//! them. A page looks at [`STORED_BUDGET`] rows at most (each costs more than one of the
//! node's order: it crosses the wire and its JSON is read).

use std::cmp::Reverse;
use std::collections::HashSet;
use std::sync::Arc;

use super::Filter;
use crate::engine::auth::Identity;
use crate::engine::error::{Error, Result};
use crate::engine::hub::listing::{Page, Position};
use crate::engine::hub::ConvView;
use crate::engine::service::Orchestrator;
use crate::engine::store::{ClosedQuery, ClosedRow};

/// The most stored rows one page looks at.
pub const STORED_BUDGET: usize = 10_000;

/// How many rows one read of the store looks at, at most (the first, twice the page's limit:
/// the rows the node holds, or the filters leave out, are looked at too).
const CHUNK: usize = 1_000;

/// The stored closed conversations that pass a page's filters, in list order.
#[derive(Debug, Default)]
pub(super) struct Stored {
    rows: Vec<(ClosedRow, Position)>,
    /// Where the store's side stopped, when it may hold more.
    next: Option<Position>,
}

/// Where `p` comes in list order (smaller first).
fn place(p: &Position) -> (Reverse<i64>, &str) {
    (Reverse(p.ms), p.key.as_str())
}

/// The earlier of two stopping places (`None`: that side ran out).
fn earlier(a: Option<Position>, b: Option<Position>) -> Option<Position> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if place(&a) <= place(&b) { a } else { b }),
        (a, b) => a.or(b),
    }
}

impl Orchestrator {
    /// The stored closed conversations of `tenant` after the page's cursor that pass its
    /// filters and that this node does not hold, up to the page's limit.
    pub(super) async fn stored_closed(
        &self,
        who: &Identity,
        tenant: &str,
        filter: &Filter,
    ) -> Result<Stored> {
        // A participant's own (an admin's, or a scenario's agent's, are checked on the view).
        let agent = (!who.admin && who.scope.is_none()).then(|| who.agent_id.to_string());
        let mut query = ClosedQuery {
            tenant: tenant.to_string(),
            agent,
            after: filter.after.as_ref().map(|p| (p.ms, p.key.clone())),
            active_after_ms: filter.updated_after_ms,
            limit: CHUNK,
        };
        let (mut out, mut looked) = (Stored::default(), 0);
        loop {
            let chunk = if looked == 0 { 2 * filter.limit } else { CHUNK };
            query.limit = chunk.min(CHUNK).min(STORED_BUDGET - looked);
            let (store, asked) = (self.store.clone(), query.clone());
            let rows = tokio::task::spawn_blocking(move || store.closed_page(&asked))
                .await
                .map_err(|e| Error::Unavailable(format!("the list's read stopped: {e}")))??;
            let full = rows.len() == query.limit;
            for row in rows {
                looked += 1;
                let at = Position {
                    ms: row.active_ms,
                    key: row.key.clone(),
                };
                query.after = Some((at.ms, at.key.clone()));
                let held = self.hub.get(&row.key).is_some();
                if row.hit && !held && filter.matches_row(&row) {
                    out.rows.push((row, at.clone()));
                    if out.rows.len() == filter.limit {
                        out.next = Some(at);
                        return Ok(out);
                    }
                }
            }
            if !full {
                return Ok(out);
            }
            if looked >= STORED_BUDGET {
                out.next = query.after.map(|(ms, key)| Position { ms, key });
                return Ok(out);
            }
        }
    }

    /// The page of `held` (the node's order) and `stored` merged in list order: as far as
    /// both sides were read, up to the page's limit. The stored ones shown are taken in and
    /// checked on their view as the held ones were.
    pub(super) async fn merge_stored(
        &self,
        who: &Identity,
        filter: &Filter,
        held: Page,
        stored: Stored,
    ) -> Page {
        let bound = earlier(held.next, stored.next);
        let within = |p: &Position| bound.as_ref().is_none_or(|b| place(p) <= place(b));
        let shown: HashSet<&str> = held.views.iter().map(|(v, _)| v.id.as_str()).collect();
        enum Listed {
            Held(Arc<ConvView>),
            Stored(String),
        }
        let mut all: Vec<(Listed, Position)> = stored
            .rows
            .into_iter()
            .filter(|(r, at)| within(at) && !shown.contains(r.key.as_str()))
            .map(|(r, at)| (Listed::Stored(r.key), at))
            .collect();
        all.extend(
            held.views
                .into_iter()
                .filter(|(_, at)| within(at))
                .map(|(v, at)| (Listed::Held(v), at)),
        );
        all.sort_by(|a, b| place(&a.1).cmp(&place(&b.1)));
        all.truncate(filter.limit);
        let next = match all.last() {
            Some((_, at)) if all.len() == filter.limit => Some(at.clone()),
            _ => bound,
        };
        // Taken in together, so that the writer loads them in few batches.
        let loads = all.iter().filter_map(|(l, _)| match l {
            Listed::Stored(key) => Some(self.ensure_known(key)),
            Listed::Held(_) => None,
        });
        futures::future::join_all(loads).await;
        let views = all
            .into_iter()
            .filter_map(|(l, at)| match l {
                Listed::Held(v) => Some((v, at)),
                Listed::Stored(key) => self
                    .hub
                    .get(&key)
                    .filter(|v| self.lists(who, v) && filter.matches(v))
                    .map(|v| (v, at)),
            })
            .collect();
        Page { views, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64, key: &str) -> Option<Position> {
        Some(Position {
            ms,
            key: key.into(),
        })
    }

    #[test]
    fn the_earlier_stop_is_the_newer_activity_then_the_smaller_key() {
        assert_eq!(earlier(at(5, "b"), at(9, "z")), at(9, "z"));
        assert_eq!(earlier(at(5, "b"), at(5, "a")), at(5, "a"));
        assert_eq!(earlier(None, at(1, "a")), at(1, "a"));
        assert_eq!(earlier(None, None), None);
    }
}
