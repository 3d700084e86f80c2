//! One thread owns the connection; async callers send it closures. SQLite calls block, so they
//! must not run on the runtime's threads, and one long-lived thread is cheaper than a
//! `spawn_blocking` hop per call.

use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::error::Error;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

#[derive(Debug)]
pub(crate) struct Worker {
    jobs: mpsc::Sender<Job>,
}

impl Worker {
    /// Starts the thread; it ends when the last `Worker` handle is dropped.
    pub(crate) fn start(mut conn: Connection) -> Result<Worker, Error> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("dlock-sqlite".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    job(&mut conn);
                }
            })
            .map_err(|source| Error::Io {
                path: "(worker thread)".into(),
                source,
            })?;
        Ok(Worker { jobs })
    }

    /// Runs `job` on the connection. If the caller is gone by the time the job finishes,
    /// `abandoned` gets the result (to undo an acquisition nobody will release).
    pub(crate) async fn call<T, F, A>(&self, job: F, abandoned: A) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> T + Send + 'static,
        A: FnOnce(&mut Connection, T) + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Box::new(move |conn| {
                let result = job(conn);
                if let Err(result) = reply.send(result) {
                    abandoned(conn, result);
                }
            }))
            .map_err(|_| Error::WorkerGone)?;
        answer.await.map_err(|_| Error::WorkerGone)
    }
}
