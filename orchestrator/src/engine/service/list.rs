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
use crate::engine::hub::ConvView;

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
        let status = || v.status();
        let status_ok = match self.status {
            None => true,
            Some(ListStatus::Active) => status() == ConversationStatus::Active,
            Some(ListStatus::Paused) => status() == ConversationStatus::Paused,
            Some(ListStatus::Closed) => status() == ConversationStatus::Closed,
            Some(ListStatus::Open) => status() != ConversationStatus::Closed,
        };
        status_ok
            && self
                .participant
                .as_deref()
                .is_none_or(|a| v.is_participant(a))
            && self
                .scenario
                .as_deref()
                .is_none_or(|s| v.scenario() == Some(s))
            && self.metadata.as_ref().is_none_or(|want| {
                let have = v.metadata();
                want.iter()
                    .all(|(k, x)| have.and_then(|m| m.get(k)) == Some(x))
            })
            && self.created_after_ms.is_none_or(|t| v.created_ms() > t)
            && self
                .query
                .as_deref()
                .is_none_or(|q| v.search_text().contains(q))
    }
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
        self.load_closed_of(who).await;
        let page = self.hub.listing().page(
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
                let readable = self.may_see(who, v)
                    && who.scope.as_ref().is_none_or(|s| self.within(v, &s.home));
                if readable && filter.matches(v) {
                    Visit::Take
                } else {
                    Visit::Skip
                }
            },
        );
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
