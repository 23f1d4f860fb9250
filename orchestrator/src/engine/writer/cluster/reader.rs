//! What other nodes committed to conversations a batch does not write, read off the writer's
//! path by a thread of its own, and taken in between batches.

use super::*;

/// The writer's reader on a shared store: a thread with a connection of its own that reads
/// what other nodes committed past this node's views of conversations a batch does not write,
/// one read at a time, and hands it back to the writer as a job ([`SharedJob::TakeIn`]). The writer
/// would otherwise read it in each batch's transaction, before the batch's own commit: with
/// three nodes, two thirds of the cluster's writes read back on every writer's path.
#[derive(Debug)]
pub(in crate::engine::writer) struct Reader {
    asks: std::sync::mpsc::Sender<Vec<(i64, u64)>>,
    /// Whether a read was asked for and its job has not come back yet.
    in_flight: bool,
    /// The conversations heard of while a read was in flight: the next read's.
    pending: Vec<i64>,
}

impl Reader {
    /// Whether the next batch would ask for a read (from the writer's views, which must then
    /// be the log's: see [`Writer::plain`]).
    pub(in crate::engine::writer) fn would_ask(&self) -> bool {
        !self.in_flight && !self.pending.is_empty()
    }
}

impl Reader {
    /// Starts the thread, reading on `log`'s connection and queueing what it reads on `jobs`;
    /// it ends with the writer (when the writer's end of its requests is dropped).
    pub(in crate::engine::writer) fn start(
        mut log: Box<dyn LogWriter>,
        jobs: mpsc::Sender<Job>,
    ) -> std::io::Result<Reader> {
        let (asks, asked) = std::sync::mpsc::channel::<Vec<(i64, u64)>>();
        std::thread::Builder::new()
            .name("log-reader".into())
            .spawn(move || {
                while let Ok(from) = asked.recv() {
                    let read = log.read_many(&from).map_err(|e| {
                        tracing::warn!(error = %e, conversations = from.len(), "could not read what other nodes committed; asked again at the next batch");
                        from.iter().map(|f| f.0).collect()
                    });
                    if jobs.blocking_send(Job::Shared(SharedJob::TakeIn(read))).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Reader {
            asks,
            in_flight: false,
            pending: Vec::new(),
        })
    }
}

impl Writer {
    /// Takes in what other nodes committed past this node's views of conversations `ids`,
    /// which a client reads here ([`SharedJob::Follow`]).
    pub(in crate::engine::writer) fn follow(&mut self, ids: &[String]) {
        let nums: Vec<i64> = ids
            .iter()
            .filter_map(|id| {
                let at = self.convs.find(id)?;
                let slot = &self.convs.slots[at];
                slot.behind().then_some(slot.num)
            })
            .collect();
        self.read_behind(nums);
    }

    /// Has the reader read what the log holds past this node's views of `nums` (conversations
    /// other nodes committed to), off the writer's path: at once when no read is in flight,
    /// else with the next one.
    pub(in crate::engine::writer) fn read_behind(&mut self, nums: impl IntoIterator<Item = i64>) {
        if let Some(r) = self.cluster.reader.as_mut() {
            r.pending.extend(nums);
        }
        self.ask_reader();
    }

    pub(in crate::engine::writer) fn ask_reader(&mut self) {
        let nums = match self.cluster.reader.as_mut() {
            Some(r) if r.would_ask() => std::mem::take(&mut r.pending),
            _ => return,
        };
        let mut from: Vec<(i64, u64)> = nums
            .into_iter()
            .filter_map(|n| {
                let at = *self.convs.by_num.get(&n)?;
                Some((n, self.convs.slots[at].state.core.head))
            })
            .collect();
        from.sort_unstable();
        from.dedup_by_key(|f| f.0);
        if let Some(r) = self.cluster.reader.as_mut() {
            if !from.is_empty() && r.asks.send(from).is_ok() {
                r.in_flight = true;
            }
        }
    }

    /// Takes in what the reader read ([`SharedJob::TakeIn`]) (see [`Writer::take_in_read`]), then
    /// asks for what was heard of meanwhile. A failed read's conversations wait for the next
    /// batch.
    pub(in crate::engine::writer) fn apply_read(
        &mut self,
        read: std::result::Result<Vec<(i64, Vec<RecoveredEvent>)>, Vec<i64>>,
    ) {
        let Some(r) = self.cluster.reader.as_mut() else {
            return;
        };
        r.in_flight = false;
        match read {
            Ok(read) => {
                if let Err(e) = self.take_in_read(read) {
                    tracing::error!(error = %e, "could not take in what another node committed");
                }
                self.ask_reader();
            }
            Err(nums) => r.pending.extend(nums),
        }
    }
}
