//! [`Appending`]: an append queued for the writer, as its caller awaits it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use proto_spec::{AppendResult, RpcError};
use tokio::sync::{mpsc, oneshot};

use super::Job;
use crate::engine::error::{Error, Result};

/// Waits for room in a full queue (or reports why the job cannot be queued).
type Queueing = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// An append on its way: resolves to its result once the event is durable (see
/// [`super::WriterHandle::append`]).
#[must_use = "the append is queued; its result comes from awaiting this"]
pub struct Appending {
    /// Set while the job still waits for room in the queue (or to report a refusal).
    queueing: Option<Queueing>,
    answer: oneshot::Receiver<Result<AppendResult, RpcError>>,
}

impl std::fmt::Debug for Appending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appending")
            .field("queued", &self.queueing.is_none())
            .finish_non_exhaustive()
    }
}

impl Appending {
    /// Queues `job` now, when the queue has room (as it nearly always has); a full queue (a
    /// burst past [`super::QUEUE`]) waits for room in a future of its own, when awaited.
    /// `answer` is the receiving end of the job's reply.
    pub(super) fn queue(
        tx: &mpsc::Sender<Job>,
        job: Job,
        answer: oneshot::Receiver<Result<AppendResult, RpcError>>,
    ) -> Appending {
        let queueing: Option<Queueing> = match tx.try_send(job) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(job)) => {
                let tx = tx.clone();
                Some(Box::pin(async move {
                    tx.send(job).await.map_err(|_| Error::WriterGone)
                }))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Appending::refused(Error::WriterGone)
            }
        };
        Appending { queueing, answer }
    }

    /// An append refused before it was queued.
    pub fn refused(e: Error) -> Appending {
        let (_, answer) = oneshot::channel();
        Appending {
            queueing: Some(Box::pin(std::future::ready(Err(e)))),
            answer,
        }
    }
}

impl Future for Appending {
    type Output = Result<AppendResult>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(queueing) = self.queueing.as_mut() {
            match queueing.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => self.queueing = None,
            }
        }
        match Pin::new(&mut self.answer).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(Err(Error::WriterGone)),
            Poll::Ready(Ok(r)) => Poll::Ready(r.map_err(Error::from)),
        }
    }
}
