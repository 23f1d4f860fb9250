//! How the writer thread gathers its batches: everything queued, up to the batch's bound; a
//! batch of trailing writes waits a moment for company; the jobs the last batch put off go
//! first.

use super::*;

impl Job {
    /// An append or a creation (not a notice, a wake-up or housekeeping).
    fn writes(&self) -> bool {
        matches!(self, Job::Append { .. } | Job::Create { .. })
    }

    /// An append that may wait a moment for other writes to commit with
    /// ([`AppendRequest::trailing`]).
    fn trailing(&self) -> bool {
        matches!(self, Job::Append { request, .. } if request.trailing)
    }
}

/// A batch of trailing writes only waits up to [`TRAILING_WAIT`] for a job that is not
/// trailing, then takes what else is queued with it. An executor's `turn_start`, which its
/// agent does not wait for, comes a hundred microseconds or so before the agent's reply:
/// committed alone, it would take a sync of its own.
fn keep_company(rx: &mut mpsc::Receiver<Job>, batch: &mut Vec<Job>, max: usize) {
    let until = std::time::Instant::now() + TRAILING_WAIT;
    while batch.len() < max {
        match rx.try_recv() {
            Ok(job) => {
                let trailing = job.trailing();
                batch.push(job);
                if !trailing {
                    while batch.len() < max {
                        match rx.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    return;
                }
            }
            Err(mpsc::error::TryRecvError::Empty) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_micros(20));
            }
            Err(_) => return,
        }
    }
}

impl Writer {
    /// Begins `batch` with the jobs the last one put off, in their order.
    fn take_carried(&mut self, batch: &mut Vec<Job>) {
        self.cluster.put_off.clear();
        for (job, times) in self.cluster.carried.drain(..) {
            batch.push(job);
            self.cluster.put_off.push(times);
        }
    }

    /// The next job, waited for; on a log whose connection is driven on this thread, through
    /// the log, so that its batches in flight are sent and answered meanwhile.
    fn next_job(&mut self, rx: &mut mpsc::Receiver<Job>) -> Option<Job> {
        if !self.log.drives() {
            return rx.blocking_recv();
        }
        if let Ok(job) = rx.try_recv() {
            return Some(job);
        }
        let mut job = None;
        self.log.wait_for(std::pin::pin!(async {
            job = rx.recv().await;
        }));
        job
    }

    pub(super) fn run(&mut self, rx: mpsc::Receiver<Job>) {
        self.serve(rx);
        self.settle();
        // Every committed batch is synced, published and answered before the writer is gone.
        self.syncer.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    fn serve(&mut self, mut rx: mpsc::Receiver<Job>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            if self.cluster.carried.is_empty() {
                // While a batch is in flight, the next gathers as many jobs as it took writes
                // before it is decided (a batch as large as the last, so that overlapping costs
                // no more transactions); the batch in flight is settled first when its answer
                // comes before them (a wake-up for one settled already is passed over).
                let Some(first) = self.next_job(&mut rx) else {
                    return;
                };
                if matches!(first, Job::CommitAnswered) {
                    if self.log.landed() {
                        self.settle();
                    }
                    continue;
                }
                batch.push(first);
                let want = self.pending.as_ref().map_or(0, |p| p.again.len());
                while batch.len() < want.min(self.max_batch()) {
                    match self.next_job(&mut rx) {
                        Some(Job::CommitAnswered) if self.log.landed() => break,
                        Some(Job::CommitAnswered) => {}
                        Some(job) => {
                            let stop = matches!(job, Job::Stop);
                            batch.push(job);
                            if stop {
                                break;
                            }
                        }
                        None => break,
                    }
                }
            } else {
                self.take_carried(&mut batch);
            }
            // Group commit: see `SYNC_AHEAD`.
            self.syncer.wait_room();
            while batch.len() < self.max_batch() {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            if batch.iter().all(Job::trailing) {
                keep_company(&mut rx, &mut batch, self.max_batch());
            }
            let stop = batch.iter().any(|j| matches!(j, Job::Stop));
            let writes = batch.iter().filter(|j| Job::writes(j)).count();
            self.busy = writes > 1 || self.pending.is_some() || !rx.is_empty();
            self.process(&mut batch);
            if stop {
                rx.close();
                while let Ok(job) = rx.try_recv() {
                    batch.push(job);
                }
                self.process(&mut batch);
                // A job is put off a few times at most, then waited for: this ends.
                while !self.cluster.carried.is_empty() {
                    self.take_carried(&mut batch);
                    self.process(&mut batch);
                }
                return;
            }
        }
    }
}
