//! A store call that a dropped caller cannot interrupt between the store's grant and the
//! caller's guard: the call runs on its own task, and a grant that finds its caller gone is
//! given back at once instead of being held until its lease runs out (or, renewed by an
//! outer hold, forever).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use tokio::sync::Notify;

use crate::error::{Error, Result};

struct Slot<T> {
    result: Option<T>,
    caller_gone: bool,
}

/// What gives back an abandoned result.
type Undo<T> = Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send>;

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    done: Notify,
    undo: Mutex<Option<Undo<T>>>,
}

impl<T> Shared<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<T>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_undo(&self) -> Option<Undo<T>> {
        self.undo
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Marks the caller gone when its future is dropped, and gives back a result that arrived
/// but was never taken.
struct CallerGuard<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    armed: bool,
}

impl<T: Send + 'static> Drop for CallerGuard<T> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let orphan = {
            let mut slot = self.shared.lock();
            slot.caller_gone = true;
            slot.result.take()
        };
        // Only a result that arrived takes the undo; otherwise the task still needs it.
        if let Some(orphan) = orphan
            && let Some(undo) = self.shared.take_undo()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(undo(orphan));
        }
    }
}

/// Runs `call` on a task of its own and returns its result. If the caller's future is dropped
/// first, `undo` receives the result when it arrives (in the background), so a grant the
/// caller never saw is given back.
///
/// # Errors
///
/// `call`'s own errors; [`Error::Backend`] if its task panicked.
pub(crate) async fn run_detached<T, F>(
    backend: &'static str,
    call: F,
    undo: impl FnOnce(T) -> BoxFuture<'static, ()> + Send + 'static,
) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot {
            result: None,
            caller_gone: false,
        }),
        done: Notify::new(),
        undo: Mutex::new(Some(Box::new(undo) as Undo<T>)),
    });
    let mut guard = CallerGuard {
        shared: shared.clone(),
        armed: true,
    };
    let task_shared = shared.clone();
    let task = tokio::spawn(async move {
        let result = call.await;
        let orphan = {
            let mut slot = task_shared.lock();
            match result {
                Ok(value) if slot.caller_gone => Some(value),
                Ok(value) => {
                    slot.result = Some(value);
                    None
                }
                Err(error) => return Err(error),
            }
        };
        match orphan {
            Some(orphan) => {
                if let Some(undo) = task_shared.take_undo() {
                    undo(orphan).await;
                }
            }
            None => task_shared.done.notify_one(),
        }
        Ok(())
    });
    let outcome = match task.await {
        Ok(Ok(())) => {
            let value = shared.lock().result.take();
            value.ok_or_else(|| Error::Backend {
                backend,
                source: "a detached store call finished without a result".into(),
            })
        }
        Ok(Err(error)) => Err(error),
        Err(join) => Err(Error::Backend {
            backend,
            source: format!("a store call's task failed: {join}").into(),
        }),
    };
    guard.armed = false;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    // Paused time: the runtime's clock moves only when every task waits, so the order of the
    // sleeps below holds however loaded the machine is.
    #[tokio::test(start_paused = true)]
    async fn a_result_that_finds_its_caller_gone_is_undone() {
        let undone = Arc::new(AtomicU32::new(0));
        let counter = undone.clone();
        let call = run_detached(
            "test",
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(7u32)
            },
            move |value| {
                Box::pin(async move {
                    counter.fetch_add(value, Ordering::SeqCst);
                })
            },
        );
        // The caller gives up before the call answers.
        assert!(
            tokio::time::timeout(Duration::from_millis(10), call)
                .await
                .is_err()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(undone.load(Ordering::SeqCst), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_waits_gets_the_result_and_nothing_is_undone() {
        let undone = Arc::new(AtomicU32::new(0));
        let counter = undone.clone();
        let value = run_detached("test", async { Ok(5u32) }, move |value| {
            Box::pin(async move {
                counter.fetch_add(value, Ordering::SeqCst);
            })
        })
        .await
        .unwrap();
        assert_eq!(value, 5);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(undone.load(Ordering::SeqCst), 0);
    }
}
