//! A batch that runs again: nothing of it was written and its state was rolled back, so its jobs
//! are made anew from what each asked ([`Retry`]) and the answer each still owes.

use super::decide::BatchWork;
use super::*;

/// How one run of a batch ended.
pub(super) enum BatchEnd {
    /// Committed, left in flight, or answered (refusals included): nothing more to do for it.
    Done,
    /// Nothing of it was written and its state is rolled back: its jobs run again.
    RunAgain(RunAgain),
}

/// A batch to run again: what each of its jobs asked, the answers it owes (in job order), and
/// why.
pub(super) struct RunAgain {
    pub(super) retry: Vec<Retry>,
    pub(super) replies: Vec<Reply>,
    pub(super) why: Why,
}

/// Why a batch runs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// Another node appended to one of its conversations first: the log's key refused the
    /// commit. Its conversations are read from the log before deciding for a while.
    Conflict,
    /// An answer that writes nothing was decided on a view nothing verified, or the batch it
    /// was decided on (or its own send) failed.
    Recheck,
}

/// A batch as decided: its work, what it asks to run again, and what it needs to commit.
pub(super) struct Decided {
    pub(super) work: BatchWork,
    /// What each job asked (on a shared store), to run the batch again.
    pub(super) retry: Vec<Retry>,
    /// How many conversations the writer held before it (those after are the batch's new).
    pub(super) slots_before: usize,
    /// Its commit's time.
    pub(super) ts_ms: i64,
    pub(super) jobs: u64,
    /// Whether an answer was decided on a view nothing verified (a shared store).
    pub(super) unverified: bool,
}

/// What a job asks, without its answer's channel (which stays in the batch's replies): what
/// runs again after a conflict.
pub(super) enum Retry {
    Append(String, Box<AppendRequest>),
    Create(Box<CreateJob>),
    Load(String),
}

impl Retry {
    pub(super) fn of(job: &Job) -> Option<Retry> {
        match job {
            Job::Append {
                conversation,
                request,
                ..
            } => Some(Retry::Append(conversation.clone(), request.clone())),
            Job::Create { conv, .. } => Some(Retry::Create(conv.clone())),
            Job::Shared(SharedJob::Load { id, .. }) => Some(Retry::Load(id.clone())),
            Job::Shared(_) | Job::Delete { .. } | Job::CommitAnswered | Job::Stop => None,
        }
    }
}

/// The jobs of a batch to run again: each request with the reply it owes (the replies are in
/// job order, one per job that [`Retry::of`] kept).
pub(super) fn again_with(again: Vec<Retry>, replies: Vec<Reply>) -> Vec<Job> {
    let mut jobs = Vec::with_capacity(again.len());
    let mut unmatched = Vec::new();
    for (a, r) in again.into_iter().zip(replies) {
        match (a, r) {
            (Retry::Append(conversation, request), Reply::Append(reply, _)) => {
                jobs.push(Job::Append {
                    conversation,
                    request,
                    reply,
                })
            }
            (Retry::Create(conv), Reply::Create(reply, _)) => {
                jobs.push(Job::Create { conv, reply })
            }
            (Retry::Load(id), Reply::Create(reply, _)) => {
                jobs.push(Job::Shared(SharedJob::Load { id, reply }))
            }
            (_, r) => unmatched.push(r),
        }
    }
    fail_all(unmatched, "internal error: a batch could not be run again");
    jobs
}
