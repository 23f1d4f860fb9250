//! Following the other nodes' commits: a connection that LISTENs on [`CHANNEL`]; a look at
//! the record of commits (`commits`) for what no notification said — each time the connection
//! is made (notifications are not queued for a node that is not listening), after a notice the
//! writer had no room for, and every [`SAFETY_POLL`] whatever happens; and now and then the
//! trimming of that record and of claims long expired. While the connection is up every
//! commit's notification reaches it (PostgreSQL delivers a notification to every session
//! listening when the transaction commits), so there is nothing to poll for: a poll reads up to
//! 30 seconds of the record, which under load is hundreds of thousands of entries.

use std::time::Duration;

use tokio_postgres::NoTls;

use super::{Changed, CHANNEL};
use crate::engine::error::{Error, Result};
use crate::engine::store::{now_ms, Heard};

/// How long the record of commits (`commits`, what a poll reads) is kept, well past
/// [`super::LATELY`], and a turn claim after its lease ended.
const COMMITS_KEPT: Duration = Duration::from_secs(300);

/// How often the listener wakes: to look again when a notice was dropped, and to trim.
pub const TICK: Duration = Duration::from_secs(1);

/// How often a node looks at everything changed lately even though it heard of every commit:
/// a last line of defence, not a part of how commits are followed.
pub const SAFETY_POLL: Duration = Duration::from_secs(30);

/// Listens for the other nodes' commits on [`CHANNEL`] and tells `changed` of them until it
/// answers [`Heard::Stop`]. A lost connection is made again (with a look at everything changed
/// lately, for what was committed meanwhile), polling until it is back.
pub(super) async fn listen(config: tokio_postgres::Config, changed: Changed) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match listen_once(&config, &changed).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "listening for other nodes' commits failed; polling until it is back");
            }
        }
        if changed(None) == Heard::Stop {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One listening connection, until it fails (`Err`) or `changed` no longer wants to know.
async fn listen_once(config: &tokio_postgres::Config, changed: &Changed) -> Result<()> {
    use futures::StreamExt;
    let (client, mut conn) = config.connect(NoTls).await?;
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_string()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "the listening connection ended");
                    return;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    // Listening from here on: whatever was committed before is found by this look.
    let mut missed = match changed(None) {
        Heard::Stop => {
            driver.abort();
            return Ok(());
        }
        heard => heard == Heard::Dropped,
    };
    let mut tick = tokio::time::interval(TICK);
    let mut ticks: u64 = 0;
    let safety = SAFETY_POLL.as_secs() / TICK.as_secs();
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let heard = tokio::select! {
            n = notices.recv() => match n {
                Some(payload) => changed(parse_notice(&payload)),
                None => return Err(Error::Unavailable("the listening connection ended".into())),
            },
            _ = tick.tick() => {
                ticks += 1;
                if ticks % 30 == 1 {
                    // Every node trims the record of commits, and the claims whose lease ended
                    // long ago, now and then (deleting the same rows twice is harmless). A write
                    // whose claim row is gone is refused like one whose fence was taken over,
                    // and a claim asked again makes a new row with a new fence.
                    let before = now_ms() - COMMITS_KEPT.as_millis() as i64;
                    let kept_ms = COMMITS_KEPT.as_millis() as i64;
                    let trimmed = client
                        .batch_execute(&format!(
                            "DELETE FROM commits WHERE at_ms < {before}; \
                             WITH old AS (SELECT conversation_id, turn FROM turn_claims \
                               WHERE lease_until_ms < \
                                 (extract(epoch from clock_timestamp()) * 1000)::bigint - {kept_ms} \
                               ORDER BY 1, 2 FOR UPDATE) \
                             DELETE FROM turn_claims t USING old o \
                               WHERE t.conversation_id = o.conversation_id AND t.turn = o.turn"
                        ))
                        .await;
                    if let Err(e) = trimmed {
                        tracing::debug!(error = %e, "trimming commits and old claims failed");
                    }
                }
                if !(missed || ticks.is_multiple_of(safety)) {
                    continue;
                }
                missed = false;
                changed(None)
            }
        };
        match heard {
            Heard::Taken => {}
            Heard::Dropped => missed = true,
            Heard::Stop => {
                driver.abort();
                return Ok(());
            }
        }
    }
}

/// A notification's conversations (`num:head,…`); `None` for `*` or anything unreadable
/// (then everything changed lately is looked at).
fn parse_notice(payload: &str) -> Option<Vec<(i64, u64)>> {
    payload
        .split(',')
        .map(|pair| {
            let (num, head) = pair.split_once(':')?;
            Some((num.parse().ok()?, head.parse().ok()?))
        })
        .collect()
}
