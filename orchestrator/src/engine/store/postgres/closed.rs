//! Closed conversations as lists read them. A node holds the open conversations and the
//! closed ones a client named; the rest stay in the database, where the commit that closes a
//! conversation records its place in lists (`active_ms`: its participants' last event, else
//! its creation) and what filters read (`created_ms`, `scenario`). A list reads them a page at
//! a time through the partial index `conversations_closed_listed` (schema version 10), by
//! tenant then newest activity first: a page costs the rows it looks at, however many are
//! closed.

use super::PgStore;
use crate::engine::error::Result;
use crate::engine::store::{ClosedQuery, ClosedRow};

/// A key's tenant in SQL, as `proto_spec::tenant::tenant_of` reads it, and as the index
/// names it (a query must say it in these words for PostgreSQL to use the index).
pub const TENANT_OF_ID: &str =
    "(CASE WHEN strpos(id, '/') > 0 THEN split_part(id, '/', 1) ELSE 'default' END)";

/// What the closing commit records of conversation `c` (events inserted before it).
pub const CLOSED_PLACE: &str = "created_ms = (SELECT ts_ms FROM events WHERE conv = c.num AND seq = 1), \
     scenario = (SELECT payload::jsonb ->> 'scenario' FROM events WHERE conv = c.num AND seq = 1), \
     active_ms = COALESCE((SELECT ts_ms FROM events WHERE conv = c.num AND author <> 'orchestrator' \
                           ORDER BY seq DESC LIMIT 1), \
                          (SELECT ts_ms FROM events WHERE conv = c.num AND seq = 1), 0)";

/// One page: the rows looked at (`$5` of them) in list order, after (`$2` ms, `$3` key) and
/// active after `$4`; the whole row only where agent `$6` (`''`: anyone) takes part.
fn page_sql() -> String {
    format!(
        "SELECT id, active_ms, hit, created_ms, scenario, \
                CASE WHEN hit THEN participants::text END, CASE WHEN hit THEN metadata::text END \
         FROM (SELECT id, active_ms, created_ms, scenario, participants, metadata, \
                      ($6 = '' OR participants ? $6) AS hit \
               FROM conversations \
               WHERE closed AND {TENANT_OF_ID} = $1 AND active_ms <= $2 \
                 AND (active_ms < $2 OR id > $3) AND active_ms > $4 \
               ORDER BY active_ms DESC, id LIMIT $5) looked \
         ORDER BY active_ms DESC, id"
    )
}

impl PgStore {
    pub(super) fn read_closed_page(&self, q: &ClosedQuery) -> Result<Vec<ClosedRow>> {
        let (ms, key) = q.after.clone().unwrap_or((i64::MAX, String::new()));
        let tenant = q.tenant.clone();
        let agent = q.agent.clone().unwrap_or_default();
        let active_after = q.active_after_ms.unwrap_or(i64::MIN);
        let limit = q.limit as i64;
        let rows = self.with_client(move |c| async move {
            let st = c.prepare_cached(&page_sql()).await?;
            Ok(
                c.query(&st, &[&tenant, &ms, &key, &active_after, &limit, &agent])
                    .await?,
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| {
                let hit: bool = r.get(2);
                let text = |i: usize| r.get::<_, Option<String>>(i);
                ClosedRow {
                    key: r.get(0),
                    active_ms: r.get(1),
                    hit,
                    created_ms: r.get::<_, Option<i64>>(3).unwrap_or(0),
                    scenario: r.get(4),
                    participants: text(5)
                        .and_then(|t| serde_json::from_str(&t).ok())
                        .unwrap_or_default(),
                    metadata: text(6).and_then(|t| serde_json::from_str(&t).ok()),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_index_and_the_closing_say_what_the_page_says() {
        let step = super::super::migrations::MIGRATIONS[9];
        assert!(step.contains(&format!(
            "conversations_closed_listed ON conversations ({}, active_ms DESC, id) WHERE closed",
            super::TENANT_OF_ID
        )));
        assert!(step.contains(super::CLOSED_PLACE));
        assert!(super::page_sql().contains(super::TENANT_OF_ID));
    }
}
