//! Following the other nodes' commits: a connection that LISTENs on [`CHANNEL`], a poll of
//! the record of commits every [`POLL_EVERY`] for what a notification did not say, and now and
//! then the trimming of that record and of claims long expired.

use std::time::Duration;

use tokio_postgres::NoTls;

use super::{Changed, CHANNEL};
use crate::engine::error::{Error, Result};
use crate::engine::store::now_ms;

/// How long the record of commits (`commits`, what a poll reads) is kept, well past
/// [`super::LATELY`], and a turn claim after its lease ended.
const COMMITS_KEPT: Duration = Duration::from_secs(300);

/// How often a node looks for commits of other nodes it was not told about (a notification
/// is lost while the listening connection is down).
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Listens for the other nodes' commits on [`CHANNEL`], and polls every [`POLL_EVERY`]; tells
/// `changed` until it answers false. A lost connection is made again (with a poll right after,
/// for what was committed meanwhile).
pub(super) async fn listen(config: tokio_postgres::Config, changed: Changed) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match listen_once(&config, &changed).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "listening for other nodes' commits failed; polling until it is back");
            }
        }
        if !changed(None) {
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
    // Listening from here on: whatever was committed before is found by a poll.
    if !changed(None) {
        driver.abort();
        return Ok(());
    }
    let mut poll = tokio::time::interval(POLL_EVERY);
    let mut polls: u64 = 0;
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wants = tokio::select! {
            n = notices.recv() => match n {
                Some(payload) => changed(parse_notice(&payload)),
                None => return Err(Error::Unavailable("the listening connection ended".into())),
            },
            _ = poll.tick() => {
                polls += 1;
                if polls % 30 == 1 {
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
                changed(None)
            }
        };
        if !wants {
            driver.abort();
            return Ok(());
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
