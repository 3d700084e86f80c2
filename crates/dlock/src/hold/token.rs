//! Lock tokens: 128 random bits per acquisition, written as the 32 hex digits of a version-4
//! UUID, from a ChaCha generator per thread seeded once from the operating system, so taking a
//! token makes no system call (`Uuid::new_v4` made one per token). A forked child would repeat
//! its parent's tokens from the copied generator, and two holders with one token would both
//! own the lock: a fork handler counts forks, and a generator seeded before the last fork is
//! seeded again.

use std::cell::RefCell;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Forks this process went through, as its child (raised by the handler in the child).
static FORKS: AtomicU64 = AtomicU64::new(0);
static FORK_HANDLER: Once = Once::new();
/// Set when the fork handler could not be registered: tokens then come from the operating
/// system, one call each.
static NO_FORK_HANDLER: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread's generator and the fork count it was seeded at.
    static GENERATOR: RefCell<Option<(u64, StdRng)>> = const { RefCell::new(None) };
}

/// A fresh lock token, unique per acquisition.
pub(crate) fn fresh() -> String {
    // Registered before the first generator is seeded: a fork can never copy a seeded
    // generator without the child knowing.
    FORK_HANDLER.call_once(register_fork_handler);
    if NO_FORK_HANDLER.load(Ordering::Relaxed) {
        return uuid::Uuid::new_v4().simple().to_string();
    }
    let bytes: [u8; 16] = GENERATOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let forks = FORKS.load(Ordering::SeqCst);
        match &mut *slot {
            Some((seeded_at, generator)) if *seeded_at == forks => generator.random(),
            _ => slot.insert((forks, StdRng::from_os_rng())).1.random(),
        }
    });
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .simple()
        .to_string()
}

#[cfg(unix)]
fn register_fork_handler() {
    extern "C" fn in_child() {
        FORKS.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: the handler only raises an atomic counter, which is async-signal-safe, and
    // stays valid for the life of the process.
    #[allow(unsafe_code)]
    let status = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    if status != 0 {
        tracing::warn!(
            status,
            "cannot register dlock's fork handler: a forked child takes its lock tokens from \
             the operating system instead"
        );
        NO_FORK_HANDLER.store(true, Ordering::Relaxed);
    }
}

#[cfg(not(unix))]
fn register_fork_handler() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_uuid_shaped_and_distinct() {
        let tokens: std::collections::HashSet<String> = (0..1000).map(|_| fresh()).collect();
        assert_eq!(tokens.len(), 1000);
        for token in &tokens {
            assert_eq!(token.len(), 32);
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            let uuid = uuid::Uuid::parse_str(token).unwrap();
            assert_eq!(uuid.get_version_num(), 4);
        }
    }

    /// A child forked after its parent took a token continues from a copy of the parent's
    /// generator: without the fork handler its next token is the parent's next one.
    #[cfg(unix)]
    #[test]
    #[allow(unsafe_code)]
    fn a_forked_child_does_not_repeat_its_parents_tokens() {
        let _seeded = fresh();
        let mut fds = [0; 2];
        // SAFETY: plain system calls; the child only takes a token, writes it and exits.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let token = fresh();
                libc::write(fds[1], token.as_ptr().cast(), token.len());
                libc::_exit(0);
            }
            let parents = fresh();
            let mut childs = [0u8; 32];
            let read = libc::read(fds[0], childs.as_mut_ptr().cast(), childs.len());
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert_eq!(read, 32);
            assert_ne!(
                &childs[..],
                parents.as_bytes(),
                "the child repeated the parent's token"
            );
        }
    }
}
