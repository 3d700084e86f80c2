//! The auto traits users rely on, checked at compile time (tokio's `tests/async_send_sync.rs`
//! style): the client, every builder and guard, and the futures and streams they return are
//! `Send`, so they go into `tokio::spawn`; the owned ones are `'static` too. A field or an
//! `.await` that makes one of them lose a bound fails this file's build, not a user's.
//!
//! Nothing here runs: the functions are only type-checked.
#![allow(dead_code)]

use std::time::Duration;

use dlock::{
    Hold, Locks, MultiGuard, MultiLockBuilder, MutexBuilder, MutexGuard, Permit, ReadGuard,
    RwLockBuilder, SemaphoreBuilder, WriteGuard,
};

/// Owned: may move into a spawned task and be shared with others.
fn owned<T: Send + Sync + 'static>() {}

/// A future or stream that may move into a spawned task.
fn send<T: Send>(_: &T) {}

/// One that may also outlive the borrow it was made from.
fn send_static<T: Send + 'static>(_: &T) {}

#[test]
fn the_client_builders_and_guards_are_owned_send_and_sync() {
    owned::<Locks>();
    owned::<MutexBuilder>();
    owned::<SemaphoreBuilder>();
    owned::<RwLockBuilder>();
    owned::<MultiLockBuilder>();
    owned::<MutexGuard>();
    owned::<Permit>();
    owned::<ReadGuard>();
    owned::<WriteGuard>();
    owned::<MultiGuard>();
    owned::<Box<dyn Hold>>();
    owned::<dlock::LockInfo>();
    owned::<dlock::Error>();
}

#[cfg(feature = "blocking")]
#[test]
fn the_blocking_client_and_guards_are_owned_send_and_sync() {
    use dlock::blocking;
    owned::<blocking::Locks>();
    owned::<blocking::MutexBuilder>();
    owned::<blocking::SemaphoreBuilder>();
    owned::<blocking::RwLockBuilder>();
    owned::<blocking::MultiLockBuilder>();
    owned::<blocking::MutexGuard>();
    owned::<blocking::Permit>();
    owned::<blocking::ReadGuard>();
    owned::<blocking::WriteGuard>();
    owned::<blocking::MultiGuard>();
}

/// The futures that take a hold own their builder: `'static`.
fn acquire_futures_are_send_and_static(locks: &Locks) {
    send_static(&locks.mutex("a").acquire());
    send_static(&locks.mutex("a").try_acquire());
    send_static(&locks.semaphore("s", 2).acquire());
    send_static(&locks.semaphore("s", 2).try_acquire());
    send_static(&locks.rwlock("rw").read());
    send_static(&locks.rwlock("rw").try_read());
    send_static(&locks.rwlock("rw").write());
    send_static(&locks.rwlock("rw").try_write());
    send_static(&locks.multi_lock(["a", "b"]).acquire());
    send_static(&locks.multi_lock(["a", "b"]).try_acquire());
    send_static(&locks.list(""));
}

/// The futures a guard or the client makes borrow it: `Send`.
fn guard_and_client_futures_are_send(locks: &Locks, guard: &MutexGuard, hold: &dyn Hold) {
    send(&guard.lost());
    send(&guard.reenter());
    send(&guard.extend(Duration::from_secs(1)));
    send(&guard.is_owned());
    send(&hold.lost());
    send(&hold.extend(Duration::from_secs(1)));
    send(&hold.is_owned());
    send(&locks.inspect("a"));
    send(&locks.force_release("a"));
    send(&locks.close());
    send(&dlock::connect("memory://"));
}

/// Releasing consumes the guard: `'static`.
fn release_futures_are_send_and_static(
    mutex: MutexGuard,
    permit: Permit,
    read: ReadGuard,
    write: WriteGuard,
    multi: MultiGuard,
    hold: Box<dyn Hold>,
) {
    send_static(&mutex.release());
    send_static(&permit.release());
    send_static(&read.release());
    send_static(&write.release());
    send_static(&multi.release());
    send_static(&Hold::release(hold));
}
