//! `listConversations`: a page of the conversations of a tenant the caller may read, newest
//! activity first, narrowed by filters, read from the hub's list order
//! ([`crate::engine::hub::listing`]). A page looks at a bounded number of conversations and
//! its answer stays within the answer limit, whatever the caller's number of conversations:
//! a short page says where the next one starts.

use base64::Engine as _;
use proto_spec::*;

use super::Orchestrator;
use crate::engine::auth::Identity;
use crate::engine::error::{refuse, Error, Result};
use crate::engine::hub::listing::{Position, Visit};
use crate::engine::hub::{search_text, ConvView};
use crate::engine::store::ClosedRow;

mod stored;

/// The most conversations one page looks at (those it passes by included).
pub const SCAN_BUDGET: usize = 20_000;
/// A page's size when the caller names none, and the largest it may name.
pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1_000;

/// What a page is narrowed to.
struct Filter {
    limit: usize,
    after: Option<Position>,
    status: Option<ListStatus>,
    participant: Option<String>,
    scenario: Option<String>,
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    created_after_ms: Option<i64>,
    updated_after_ms: Option<i64>,
    query: Option<String>,
}

fn invalid(path: &str, why: impl std::fmt::Display) -> Error {
    Error::Rpc(
        RpcError::new(ErrorCode::InvalidParams, format!("{path}: {why}"))
            .with_data(serde_json::json!({"path": path})),
    )
}

fn time_ms(path: &str, t: Option<&String>) -> Result<Option<i64>> {
    t.map(|t| {
        chrono::DateTime::parse_from_rfc3339(t)
            .map(|d| d.timestamp_millis())
            .map_err(|_| invalid(path, "a time as RFC 3339 (2026-01-31T12:00:00Z)"))
    })
    .transpose()
}

/// A cursor as the wire carries it: where the page stopped, opaque.
fn cursor_of(p: &Position) -> String {
    let local = proto_spec::tenant::local_id(&p.key);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}.{local}", p.ms))
}

fn position_of(cursor: &str, tenant: &str) -> Result<Position> {
    let bad = || {
        invalid(
            "cursor",
            "not a cursor this server gave (pass `nextCursor` as it came)",
        )
    };
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(bad)?;
    let (ms, id) = text.split_once('.').ok_or_else(bad)?;
    Ok(Position {
        ms: ms.parse().map_err(|_| bad())?,
        key: proto_spec::tenant::key(tenant, id),
    })
}

impl Filter {
    fn of(p: &ListConversationsParams, tenant: &str) -> Result<Filter> {
        let limit = p.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(invalid("limit", format!("1 to {MAX_LIMIT}")));
        }
        Ok(Filter {
            limit: limit as usize,
            after: p
                .cursor
                .as_deref()
                .map(|c| position_of(c, tenant))
                .transpose()?,
            status: p.status,
            participant: p.participant.clone(),
            scenario: p.scenario.clone(),
            metadata: p.metadata.clone(),
            created_after_ms: time_ms("createdAfter", p.created_after.as_ref())?,
            updated_after_ms: time_ms("updatedAfter", p.updated_after.as_ref())?,
            query: p.query.as_ref().map(|q| q.to_lowercase()),
        })
    }

    /// Whether `v` passes every filter.
    fn matches(&self, v: &ConvView) -> bool {
        self.passes(&Facts {
            status: &|| v.status(),
            takes_part: &|a| v.is_participant(a),
            scenario: v.scenario(),
            metadata: v.metadata(),
            created_ms: v.created_ms(),
            search_text: &|| v.search_text().into(),
        })
    }

    /// Whether a closed conversation the store keeps passes every filter (from its row).
    fn matches_row(&self, r: &ClosedRow) -> bool {
        self.passes(&Facts {
            status: &|| ConversationStatus::Closed,
            takes_part: &|a| r.participants.iter().any(|p| p == a),
            scenario: r.scenario.as_deref(),
            metadata: r.metadata.as_ref(),
            created_ms: r.created_ms,
            search_text: &|| search_text(&r.key, r.metadata.as_ref()).into(),
        })
    }

    fn passes(&self, f: &Facts<'_>) -> bool {
        let status_ok = match self.status {
            None => true,
            Some(ListStatus::Active) => (f.status)() == ConversationStatus::Active,
            Some(ListStatus::Paused) => (f.status)() == ConversationStatus::Paused,
            Some(ListStatus::Closed) => (f.status)() == ConversationStatus::Closed,
            Some(ListStatus::Open) => (f.status)() != ConversationStatus::Closed,
        };
        status_ok
            && self.participant.as_deref().is_none_or(f.takes_part)
            && self
                .scenario
                .as_deref()
                .is_none_or(|s| f.scenario == Some(s))
            && self.metadata.as_ref().is_none_or(|want| {
                want.iter()
                    .all(|(k, x)| f.metadata.and_then(|m| m.get(k)) == Some(x))
            })
            && self.created_after_ms.is_none_or(|t| f.created_ms > t)
            && self
                .query
                .as_deref()
                .is_none_or(|q| (f.search_text)().contains(q))
    }

    /// Whether closed conversations may pass the status filter.
    fn takes_closed(&self) -> bool {
        matches!(self.status, None | Some(ListStatus::Closed))
    }
}

/// What the filters read of a conversation, from its view or from its row in the store.
struct Facts<'a> {
    status: &'a dyn Fn() -> ConversationStatus,
    takes_part: &'a dyn Fn(&str) -> bool,
    scenario: Option<&'a str>,
    metadata: Option<&'a serde_json::Value>,
    created_ms: i64,
    search_text: &'a dyn Fn() -> std::borrow::Cow<'a, str>,
}

impl Orchestrator {
    /// The tenant whose conversations `who` lists: its own, or (an operator) the one it names.
    fn list_tenant(who: &Identity, asked: Option<&str>) -> Result<String> {
        match asked {
            None => Ok(who.tenant.to_string()),
            Some(t) if t == &*who.tenant || (who.operator && who.scope.is_none()) => {
                Ok(t.to_string())
            }
            Some(_) => Err(refuse(
                ErrorCode::Forbidden,
                "tenant: only an operator lists another tenant's conversations",
            )),
        }
    }

    /// Whether a list shows `v` to `who`.
    fn lists(&self, who: &Identity, v: &ConvView) -> bool {
        self.may_see(who, v) && who.scope.as_ref().is_none_or(|s| self.within(v, &s.home))
    }

    /// `listConversations`: a page of the conversations of the caller's tenant it may read
    /// (those it takes part in and the sub-conversations below them; every one, for an admin),
    /// newest activity first.
    pub async fn list_conversations(
        &self,
        who: &Identity,
        p: ListConversationsParams,
    ) -> Result<ListConversationsResult> {
        let tenant = Self::list_tenant(who, p.tenant.as_deref())?;
        let filter = Filter::of(&p, &tenant)?;
        // On a shared store, the closed conversations this node does not hold are read from
        // the database a page at a time, and merged in.
        let stored = if self.store.shared() {
            // Right after a start, the open ones are all held first.
            self.writer.swept().await;
            if filter.takes_closed() {
                Some(self.stored_closed(who, &tenant, &filter).await?)
            } else {
                None
            }
        } else {
            None
        };
        let held = self.hub.listing().page(
            &self.hub,
            &tenant,
            filter.after.as_ref(),
            filter.limit,
            SCAN_BUDGET,
            |v, ms| {
                // Newest first: past the time asked for, nothing more can match.
                if filter.updated_after_ms.is_some_and(|t| ms <= t) {
                    return Visit::End;
                }
                if self.lists(who, v) && filter.matches(v) {
                    Visit::Take
                } else {
                    Visit::Skip
                }
            },
        );
        let page = match stored {
            Some(stored) => self.merge_stored(who, &filter, held, stored).await,
            None => held,
        };
        let views: Vec<std::sync::Arc<ConvView>> =
            page.views.iter().map(|(v, _)| v.clone()).collect();
        self.catch_up(&views).await;
        // Within the answer limit every transport shares, whatever the participants' lists.
        let budget = self.limits.max_response_bytes().saturating_sub(64 * 1024);
        let (mut used, mut next, mut conversations) = (0, page.next, Vec::new());
        let mut last: Option<Position> = None;
        for (v, at) in page.views {
            let snapshot = v.snapshot(&who.agent_id);
            used += serde_json::to_vec(&snapshot).map_or(0, |b| b.len()) + 1;
            if used > budget && last.is_some() {
                next = last;
                break;
            }
            conversations.push(snapshot);
            last = Some(at);
        }
        Ok(ListConversationsResult {
            conversations,
            next_cursor: next.as_ref().map(cursor_of),
        })
    }
}
