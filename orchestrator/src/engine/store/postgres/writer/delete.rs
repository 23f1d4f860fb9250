//! A deletion on the writer's connection: one transaction that locks the conversations as a
//! batch that writes them does (so it commits wholly before or after such a batch), then
//! deletes their events, their turn claims and their rows, and tells the other nodes as a
//! commit does (a record in `commits` and a notification), each conversation with the head
//! [`DELETED_HEAD`]. A batch of another node that still writes one fails its check
//! (`check_convs`) and runs again once that node has heard.

use super::*;
use crate::engine::store::DELETED_HEAD;

impl PgWriter {
    pub(super) fn delete_conversations(&mut self, keys: &[String]) -> Result<Vec<String>> {
        let keys = keys.to_vec();
        self.run(move |c, st| async move {
            c.batch_execute("BEGIN").await?;
            let found = c
                .query(
                    "SELECT num, id FROM conversations WHERE id = ANY($1)",
                    &[&keys],
                )
                .await?;
            let nums: Vec<i64> = found.iter().map(|r| r.get(0)).collect();
            let ids: Vec<String> = found.iter().map(|r| r.get(1)).collect();
            c.query(&st.lock_convs, &[&nums]).await?;
            c.execute("DELETE FROM events WHERE conv = ANY($1)", &[&nums])
                .await?;
            c.execute(
                "DELETE FROM turn_claims WHERE conversation_id = ANY($1)",
                &[&ids],
            )
            .await?;
            c.execute("DELETE FROM conversations WHERE num = ANY($1)", &[&nums])
                .await?;
            if !nums.is_empty() {
                let heads: Vec<String> =
                    nums.iter().map(|n| format!("{n}:{DELETED_HEAD}")).collect();
                let heads = heads.join(",");
                let notice = match heads.len() > super::super::NOTIFY_MAX {
                    true => "*".to_string(),
                    false => heads.clone(),
                };
                c.execute(&st.record_commit, &[&now_ms(), &heads]).await?;
                c.execute(&st.notify, &[&notice]).await?;
            }
            c.batch_execute("COMMIT").await?;
            // In the order asked.
            Ok(keys.into_iter().filter(|k| ids.contains(k)).collect())
        })
    }
}
