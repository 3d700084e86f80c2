//! The acquire metrics' labels, made once per pair of values and shared without a lock.
//!
//! Lock-free on purpose: a process that forks while another thread records a metric (a Python
//! worker pool forking beside a thread that locks all the time) copies every lock that thread
//! held into the child, where nobody will ever let it go. A `Mutex` here hung a forked child's
//! first acquire (the Python suite's fork test on SQLite, in CI); an append-only list read and
//! pushed with atomics has nothing to leave held.

use std::sync::atomic::{AtomicPtr, Ordering};

/// One pair of values and its labels; leaked, so every reader may keep a `&'static` to it.
struct Made {
    backend: &'static str,
    outcome: Option<&'static str>,
    labels: &'static [metrics::Label],
    next: *mut Made,
}

/// The newest [`Made`]; each points at the one pushed before it.
static MADE: AtomicPtr<Made> = AtomicPtr::new(std::ptr::null_mut());

/// The labels `backend` and, if given, `outcome`, made once per pair of values (a handful per
/// process), so recording a metric allocates nothing: the macros build a label vector on
/// every call, recorder or not.
pub(crate) fn metric_labels(
    backend: &'static str,
    outcome: Option<&'static str>,
) -> &'static [metrics::Label] {
    let mut head = MADE.load(Ordering::Acquire);
    if let Some(labels) = find(head, backend, outcome) {
        return labels;
    }
    let mut labels = vec![metrics::Label::from_static_parts("backend", backend)];
    if let Some(outcome) = outcome {
        labels.push(metrics::Label::from_static_parts("outcome", outcome));
    }
    // Bounded: one node per backend and outcome this process records.
    let labels: &'static [metrics::Label] = Box::leak(labels.into_boxed_slice());
    let node = Box::into_raw(Box::new(Made {
        backend,
        outcome,
        labels,
        next: head,
    }));
    loop {
        match MADE.compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return labels,
            Err(newer) => {
                // Another thread pushed first; it may have pushed this very pair (then this
                // node stays unlinked: a few bytes, once per race).
                if let Some(labels) = find(newer, backend, outcome) {
                    return labels;
                }
                // SAFETY: the push failed, so no other thread has seen `node` yet.
                #[allow(unsafe_code)]
                unsafe {
                    (*node).next = newer;
                }
                head = newer;
            }
        }
    }
}

/// The labels of `backend` and `outcome` in the list that starts at `head`, if made.
fn find(
    mut head: *mut Made,
    backend: &str,
    outcome: Option<&str>,
) -> Option<&'static [metrics::Label]> {
    while !head.is_null() {
        // SAFETY: every node in the list was leaked (never freed) and fully written before the
        // release-ordered push that linked it; `head` was loaded with acquire ordering.
        #[allow(unsafe_code)]
        let made: &'static Made = unsafe { &*head };
        if made.backend == backend && made.outcome == outcome {
            return Some(made.labels);
        }
        head = made.next;
    }
    None
}

#[cfg(test)]
#[allow(unsafe_code)] // fork(2) and waitpid(2): the child's side of the test
mod tests {
    use super::metric_labels;

    #[test]
    fn each_pair_is_made_once_and_names_its_values() {
        let first = metric_labels("memory", Some("acquired"));
        let again = metric_labels("memory", Some("acquired"));
        assert!(std::ptr::eq(first, again));
        let keys: Vec<(&str, &str)> = first.iter().map(|l| (l.key(), l.value())).collect();
        assert_eq!(keys, [("backend", "memory"), ("outcome", "acquired")]);
        let gauge = metric_labels("memory", None);
        assert_eq!(gauge.len(), 1);
        assert!(!std::ptr::eq(first, gauge));
    }

    /// A fork while other threads make and read labels: the child must be able to make and
    /// read them too (a lock held by a parent's thread at the fork would hang it forever).
    #[test]
    fn a_child_forked_while_other_threads_record_can_record() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let outcomes: [&'static str; 6] = ["a", "b", "c", "d", "e", "f"];
        let churners: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut i = 0usize;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::black_box(metric_labels("fork-test", Some(outcomes[i % 6])));
                        i += 1;
                    }
                })
            })
            .collect();
        // The round whose child hung or failed (1-based), 0 when none did.
        let mut hung = 0;
        for round in 0..200 {
            // SAFETY: the child only reads and pushes labels (async-signal-unsafe allocation
            // aside, which glibc's fork handlers make safe) and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let labels = metric_labels("fork-test-child", Some(outcomes[round % 6]));
                let code = i32::from(labels.len() != 2);
                unsafe { libc::_exit(code) };
            }
            if !child_exited_ok(pid, std::time::Duration::from_secs(20)) {
                hung = round + 1;
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for churner in churners {
            churner.join().unwrap();
        }
        assert_eq!(hung, 0, "the child of fork {hung} of 200 hung or failed");
    }

    /// Whether the child `pid` exited with 0 within `limit`; a child still running is killed.
    fn child_exited_ok(pid: libc::pid_t, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child.
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            }
            if std::time::Instant::now() >= deadline {
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
