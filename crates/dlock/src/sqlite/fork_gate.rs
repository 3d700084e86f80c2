//! SQLite across `fork()`: the fork waits until no thread of this process is inside SQLite.
//!
//! SQLite keeps process-wide mutexes (its allocator's, its VFS's). A thread that is inside
//! SQLite when another thread forks leaves them locked in the child, where that thread does not
//! exist: the child's first SQLite call (a forked Python worker opening its own connection)
//! blocks forever. So every SQLite call of this crate runs [`inside`] the gate, and a handler
//! registered with `pthread_atfork` closes the gate before the fork, waits for the calls in
//! flight to return, and opens it again in the parent and in the child.
//!
//! The gate is two atomics, no lock, so a fork can never copy it held. A call that arrives while
//! a fork is pending waits (sleeping briefly) until it is over.

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

/// Forks in progress (several threads may fork at once).
static FORKING: AtomicUsize = AtomicUsize::new(0);
/// Threads inside SQLite, and briefly any thread that is checking whether it may enter.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// How long a waiting side sleeps between looks: SQLite calls take microseconds.
const NAP: Duration = Duration::from_micros(50);

thread_local! {
    /// How deep this thread is in [`inside`]: a nested call is already counted, and waiting for
    /// a fork would wait for itself.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Runs `call` (something that uses SQLite) where no fork can copy SQLite's locks held.
pub(super) fn inside<T>(call: impl FnOnce() -> T) -> T {
    let _entered = Entered::new();
    call()
}

/// This thread's place inside the gate, left when dropped (also on unwinding).
struct Entered;

impl Entered {
    fn new() -> Entered {
        register();
        let depth = DEPTH.get();
        if depth == 0 {
            loop {
                while FORKING.load(SeqCst) > 0 {
                    std::thread::sleep(NAP);
                }
                INSIDE.fetch_add(1, SeqCst);
                // Seen after our increment: a fork that began before it waits for us, one
                // that began after it is seen here and we step back out.
                if FORKING.load(SeqCst) == 0 {
                    break;
                }
                INSIDE.fetch_sub(1, SeqCst);
            }
        }
        DEPTH.set(depth + 1);
        Entered
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let depth = DEPTH.get() - 1;
        DEPTH.set(depth);
        if depth == 0 {
            INSIDE.fetch_sub(1, SeqCst);
        }
    }
}

/// Closes the gate and waits until every SQLite call in flight has returned.
fn before_fork() {
    FORKING.fetch_add(1, SeqCst);
    while INSIDE.load(SeqCst) > 0 {
        std::thread::sleep(NAP);
    }
}

/// In the parent: this fork is over.
fn after_fork_in_parent() {
    FORKING.fetch_sub(1, SeqCst);
}

/// In the child: only the forking thread exists, and it was outside SQLite. A count left by a
/// thread of the parent that was just stepping back out belongs to nobody here.
fn after_fork_in_child() {
    INSIDE.store(0, SeqCst);
    FORKING.store(0, SeqCst);
}

extern "C" fn before_fork_handler() {
    before_fork();
}

extern "C" fn after_fork_in_parent_handler() {
    after_fork_in_parent();
}

extern "C" fn after_fork_in_child_handler() {
    after_fork_in_child();
}

/// Registers the fork handlers, once per process; called when a client is built (on the
/// connecting thread, before any other thread of dlock uses SQLite) and before every call.
pub(super) fn register() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: the three handlers are plain `extern "C"` functions that only touch atomics
        // and sleep; they never unwind and stay valid for the life of the process.
        #[allow(unsafe_code)]
        let status = unsafe {
            libc::pthread_atfork(
                Some(before_fork_handler),
                Some(after_fork_in_parent_handler),
                Some(after_fork_in_child_handler),
            )
        };
        if status != 0 {
            tracing::warn!(
                status,
                "cannot register dlock's fork handlers: a process forked while dlock uses \
                 SQLite may hang in the child"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Barrier};

    /// The gate's waits, without forking the test process: a pending fork waits for the call
    /// in flight, and a call that arrives while the fork is pending waits for its end.
    #[test]
    fn a_fork_waits_for_calls_in_flight_and_holds_new_ones_back() {
        let entered = Arc::new(Barrier::new(2));
        let leave = Arc::new(AtomicBool::new(false));
        let in_flight = {
            let (entered, leave) = (entered.clone(), leave.clone());
            std::thread::spawn(move || {
                inside(|| {
                    entered.wait();
                    while !leave.load(SeqCst) {
                        std::thread::sleep(NAP);
                    }
                })
            })
        };
        entered.wait();
        let fork_done = Arc::new(AtomicBool::new(false));
        let fork = {
            let fork_done = fork_done.clone();
            std::thread::spawn(move || {
                before_fork();
                fork_done.store(true, SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !fork_done.load(SeqCst),
            "the fork went ahead with a call inside SQLite"
        );
        leave.store(true, SeqCst);
        in_flight.join().unwrap();
        fork.join().unwrap();
        assert!(fork_done.load(SeqCst));

        // The gate is closed: a new call waits until the fork is over.
        let called = Arc::new(AtomicBool::new(false));
        let late = {
            let called = called.clone();
            std::thread::spawn(move || inside(|| called.store(true, SeqCst)))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!called.load(SeqCst), "a call entered SQLite during a fork");
        after_fork_in_parent();
        late.join().unwrap();
        assert!(called.load(SeqCst));
        // A nested call on one thread is counted once: it does not wait for a fork that waits
        // for it (the outer call holds the only count), and leaving both leaves the gate.
        FORKING.fetch_add(1, SeqCst);
        let nested = std::thread::spawn(|| {
            DEPTH.set(1); // as if this thread were already inside
            inside(|| DEPTH.get())
        });
        assert_eq!(nested.join().unwrap(), 2);
        after_fork_in_parent();
        assert_eq!(inside(|| inside(|| DEPTH.get())), 2);
        assert_eq!(DEPTH.get(), 0);
    }
}
