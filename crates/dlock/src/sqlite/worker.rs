//! One thread owns the connection; async callers send it closures. SQLite calls block, so they
//! must not run on the runtime's threads, and one long-lived thread is cheaper than a
//! `spawn_blocking` hop per call.

use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::error::Error;
use super::fork_gate;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;
type UndoFn<T> = Box<dyn FnOnce(&mut Connection, T) + Send>;

#[derive(Debug)]
pub(crate) struct Worker {
    jobs: mpsc::Sender<Job>,
}

/// A result that undoes itself on the worker if nobody takes it: the caller's future was
/// dropped before or after the reply was sent, and the acquisition it carries would otherwise
/// stay held until its TTL.
struct Undoable<T: Send + 'static> {
    value: Option<T>,
    undo: Option<UndoFn<T>>,
    jobs: mpsc::Sender<Job>,
}

impl<T: Send + 'static> Undoable<T> {
    fn take(mut self) -> Option<T> {
        self.undo = None;
        self.value.take()
    }
}

impl<T: Send + 'static> Drop for Undoable<T> {
    fn drop(&mut self) {
        if let (Some(value), Some(undo)) = (self.value.take(), self.undo.take()) {
            // If the worker is gone the connection is closed and nothing is left to undo.
            let _ = self.jobs.send(Box::new(move |conn| undo(conn, value)));
        }
    }
}

impl Worker {
    /// Starts the thread; it ends when the last `Worker` handle is dropped.
    pub(crate) fn start(mut conn: Connection) -> Result<Worker, Error> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("dlock-sqlite".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    fork_gate::inside(|| job(&mut conn));
                }
                fork_gate::inside(|| drop(conn));
            })
            .map_err(|source| Error::Io {
                path: "(worker thread)".into(),
                source,
            })?;
        Ok(Worker { jobs })
    }

    /// Queues `job` without waiting for it.
    pub(crate) fn submit(&self, job: impl FnOnce(&mut Connection) + Send + 'static) {
        // If the thread is gone, so is the connection: nothing left to do.
        let _ = self.jobs.send(Box::new(job));
    }

    /// Runs `job`; if the caller is gone by the time the result would reach it, `undo` runs on
    /// the connection with that result.
    pub(crate) async fn call_undoable<T, F, U>(&self, job: F, undo: U) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        U: FnOnce(&mut Connection, T) + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let jobs = self.jobs.clone();
        self.jobs
            .send(Box::new(move |conn| {
                let result = Undoable {
                    value: Some(job(conn)),
                    undo: Some(Box::new(undo)),
                    jobs,
                };
                // On failure the result comes back and is dropped here, which queues the undo.
                let _ = reply.send(result);
            }))
            .map_err(|_| Error::WorkerGone)?;
        answer
            .await
            .map_err(|_| Error::WorkerGone)?
            .take()
            .ok_or(Error::WorkerGone)
    }
}
