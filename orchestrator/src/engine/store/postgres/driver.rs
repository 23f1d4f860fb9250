//! The runtime the writer's connection runs on: the writer thread's own, driven only while that
//! thread waits on it, so a statement and its answer pass through no other thread.

use std::future::Future;

use super::{within_timeout, Wake};
use crate::engine::error::{Error, Result};

/// What a future [`Driver::launch`]ed answers, once it has.
pub(super) type Launched<T> = tokio::sync::oneshot::Receiver<Result<T>>;

/// A runtime of the writer's thread alone, on which its connection runs: it makes progress
/// only while that thread waits on it (for an answer, or for its next job through
/// [`LogWriter::wait_for`]), so every wait of the writer's goes through it.
pub(super) struct Driver {
    pub(super) rt: tokio::runtime::Runtime,
}

impl Driver {
    pub(super) fn new() -> Result<Driver> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Setup(format!("the writer's PostgreSQL runtime: {e}")))?;
        Ok(Driver { rt })
    }

    /// Runs `f` on the runtime: here, or, when this thread runs a runtime already (a test or
    /// a tool using a writer from async code), on a thread of its own that it waits for.
    pub(super) fn on_rt<R: Send>(
        &self,
        f: impl FnOnce(&tokio::runtime::Runtime) -> R + Send,
    ) -> Result<R> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Ok(f(&self.rt));
        }
        std::thread::scope(|s| s.spawn(|| f(&self.rt)).join())
            .map_err(|_| Error::Setup("the writer's PostgreSQL runtime panicked".into()))
    }

    /// Runs `fut` here to its end, at most [`super::DB_TIMEOUT`].
    pub(super) fn block<T: Send>(&self, fut: impl Future<Output = Result<T>> + Send) -> Result<T> {
        self.on_rt(|rt| rt.block_on(within_timeout(fut)))?
    }

    /// Starts `fut` without waiting for it: polled once here, so that every request it makes
    /// of the connection is queued before this returns (requests made after are sent after
    /// them, and answered in that order), then left to the runtime (at most
    /// [`super::DB_TIMEOUT`]), which runs what it has ready so that the connection sends what
    /// was queued. [`Driver::answer`] waits for what it answers; `wake` is called once it has.
    pub(super) fn launch<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
        wake: Option<Wake>,
    ) -> Launched<T> {
        use std::task::{Context, Poll};
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut fut = Box::pin(fut);
        // The connection's requests go through channels of the `futures` crate: polling them
        // needs no runtime, and the runtime's poll registers its own waker.
        let waker = futures::task::noop_waker();
        match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(out) => {
                let _ = tx.send(out);
                if let Some(wake) = wake {
                    wake();
                }
            }
            Poll::Pending => {
                self.rt.spawn(async move {
                    let _ = tx.send(within_timeout(fut).await);
                    if let Some(wake) = wake {
                        wake();
                    }
                });
            }
        }
        self.settle();
        rx
    }

    /// Runs what the runtime has ready, and what the connection's socket has ready, without
    /// waiting: twice, since a pass that finds the socket ready only wakes the connection.
    pub(super) fn settle(&self) {
        let _ = self.on_rt(|rt| {
            rt.block_on(async {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
            })
        });
    }

    /// Waits for what a future [`Driver::launch`]ed answers.
    pub(super) fn answer<T: Send>(&self, rx: &mut Launched<T>) -> Result<T> {
        self.on_rt(|rt| rt.block_on(rx))?.unwrap_or_else(|_| {
            Err(Error::Setup(
                "the writer's PostgreSQL runtime dropped an answer".into(),
            ))
        })
    }
}
