//! A deletion on the writer's connection: one transaction that locks the conversations as a
//! batch that writes them does (so it commits wholly before or after such a batch), then
//! deletes their events, their turn claims and their rows.

use super::*;

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
            c.batch_execute("COMMIT").await?;
            // In the order asked.
            Ok(keys.into_iter().filter(|k| ids.contains(k)).collect())
        })
    }
}
