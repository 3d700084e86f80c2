#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

//! Bad input on every public entry point and every CLI command: each gets a typed error (the
//! variant is asserted) or a non-zero exit with a clear message, never a panic, and leaves no
//! lock behind (checked with `inspect` and `list` on the store afterwards). Tricky but valid
//! names (path-like, SQL wildcards, multi-byte, exactly the maximum length) must round-trip.
//!
//! The API matrix runs on every backend this build enables (the test kit's fixture list), on
//! real servers the test kit starts (a server missing now but found at build fails it:
//! `dlock_testkit::require`); the CLI matrix drives the built `dlock` binary on a SQLite file.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use dlock::Error;
use dlock::limits::{MAX_NAME_LEN, MAX_TTL, MIN_TTL};
use dlock_testkit::fixture::{Fixture, start_enabled};
use dlock_testkit::require::missing_now;
use futures::TryStreamExt;

dlock_testkit::fail_if_a_required_server_was_missing_at_build!();

/// A failed expectation, collected so one run reports every case.
type Failures = Vec<String>;

fn expect<T: std::fmt::Debug>(
    failures: &mut Failures,
    case: &str,
    result: dlock::Result<T>,
    wanted: &str,
    matches: impl Fn(&Error) -> bool,
) {
    match result {
        Err(error) if matches(&error) => {
            // A clear message: it says what was wrong, not just that something was.
            if error.to_string().len() < 10 {
                failures.push(format!("{case}: unclear message {error}"));
            }
        }
        other => failures.push(format!("{case}: expected {wanted}, got {other:?}")),
    }
}

fn invalid_name(e: &Error) -> bool {
    matches!(e, Error::InvalidName { .. })
}

fn invalid_argument(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { .. })
}

fn not_owned(e: &Error) -> bool {
    matches!(e, Error::NotOwned { .. })
}

/// The API matrix on one backend's client; returns the failed cases.
async fn api_matrix(fixture: &dyn Fixture) -> Failures {
    let backend = fixture.backend();
    let locks = fixture.connect().await.expect("connect");
    let prefix = format!("bad-input-{}/", uuid::Uuid::new_v4().simple());
    let name = format!("{prefix}lock");
    let long = "n".repeat(MAX_NAME_LEN + 1);
    let mut f = Failures::new();
    let short = Duration::from_secs(5);

    // Names, on every entry point that takes one.
    expect(
        &mut f,
        "acquire \"\"",
        locks.mutex("").acquire().await,
        "InvalidName",
        invalid_name,
    );
    expect(
        &mut f,
        "acquire 513 bytes",
        locks.mutex(long.clone()).acquire().await,
        "InvalidName",
        invalid_name,
    );
    expect(
        &mut f,
        "acquire NUL",
        locks.mutex("a\0b").acquire().await,
        "InvalidName",
        invalid_name,
    );
    expect(
        &mut f,
        "try_acquire \"\"",
        locks.mutex("").try_acquire().await,
        "InvalidName",
        invalid_name,
    );
    expect(
        &mut f,
        "inspect \"\"",
        locks.inspect("").await,
        "InvalidName",
        invalid_name,
    );
    expect(
        &mut f,
        "inspect 513 bytes",
        locks.inspect(&long).await,
        "InvalidName",
        invalid_name,
    );
    expect(
        &mut f,
        "force_release NUL",
        locks.force_release("x\0").await,
        "InvalidName",
        invalid_name,
    );
    expect(
        &mut f,
        "force_release \"\"",
        locks.force_release("").await,
        "InvalidName",
        invalid_name,
    );
    let listed: dlock::Result<Vec<_>> = locks
        .list(&"p".repeat(MAX_NAME_LEN + 1))
        .try_collect()
        .await;
    expect(
        &mut f,
        "list 513-byte prefix",
        listed,
        "InvalidName",
        invalid_name,
    );
    let listed: dlock::Result<Vec<_>> = locks.list("a\0").try_collect().await;
    expect(
        &mut f,
        "list NUL prefix",
        listed,
        "InvalidName",
        invalid_name,
    );

    // Durations.
    let m = || locks.mutex(name.clone()).no_wait();
    expect(
        &mut f,
        "ttl 0",
        m().ttl(Duration::ZERO).acquire().await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "ttl below MIN_TTL",
        m().ttl(MIN_TTL - Duration::from_millis(1)).acquire().await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "ttl above MAX_TTL",
        m().ttl(MAX_TTL + Duration::from_secs(1)).acquire().await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "ttl Duration::MAX",
        m().ttl(Duration::MAX).acquire().await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "try_acquire ttl 0",
        m().ttl(Duration::ZERO).try_acquire().await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "wait Duration::MAX",
        locks
            .mutex(name.clone())
            .wait(Duration::MAX)
            .acquire()
            .await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "max_hold 0",
        m().max_hold(Duration::ZERO).acquire().await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "max_hold Duration::MAX",
        m().max_hold(Duration::MAX).acquire().await,
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "watchdog lease 0",
        locks.with_watchdog_lease(Duration::ZERO),
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "watchdog lease Duration::MAX",
        locks.with_watchdog_lease(Duration::MAX),
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "label 257 bytes",
        locks.with_label("l".repeat(257)),
        "InvalidArgument",
        invalid_argument,
    );
    expect(
        &mut f,
        "label NUL",
        locks.with_label("a\0b"),
        "InvalidArgument",
        invalid_argument,
    );

    // Capabilities the store lacks are Unsupported, never silently ignored.
    let caps = locks.info().capabilities;
    if !caps.fair {
        expect(
            &mut f,
            "fair unsupported",
            m().fair().acquire().await,
            "Unsupported",
            |e| matches!(e, Error::Unsupported { .. }),
        );
    }
    if !caps.reentrant {
        expect(
            &mut f,
            "reentrant unsupported",
            m().reentrant().acquire().await,
            "Unsupported",
            |e| matches!(e, Error::Unsupported { .. }),
        );
    }

    // Where the store has no inspection, `inspect`/`list`/`force_release` say so, and a
    // second client's attempt to take a lock stands in for `inspect`.
    let monitor = caps.monitor;
    // Listing by prefix, where the store can (not PostgreSQL's session locks, which it
    // inspects by name only).
    let list = caps.list;
    let probe = fixture.connect().await.expect("connect a probe");
    let held_by_probe = async |name: &str| -> dlock::Result<Option<String>> {
        if monitor {
            return Ok(locks.inspect(name).await?.map(|info| info.name));
        }
        match probe.mutex(name).ttl(short).try_acquire().await? {
            Some(guard) => {
                guard.release().await?;
                Ok(None)
            }
            None => Ok(Some(name.to_owned())),
        }
    };
    if !monitor {
        let unsupported = |e: &Error| matches!(e, Error::Unsupported { .. });
        expect(
            &mut f,
            "inspect without monitor",
            locks.inspect(&name).await,
            "Unsupported",
            unsupported,
        );
        expect(
            &mut f,
            "force_release without monitor",
            locks.force_release(&name).await,
            "Unsupported",
            unsupported,
        );
    }

    // A guard: bad extends leave it held; operations on a broken one are NotOwned.
    match m().ttl(short).acquire().await {
        Ok(guard) => {
            expect(
                &mut f,
                "extend 0",
                guard.extend(Duration::ZERO).await,
                "InvalidArgument",
                invalid_argument,
            );
            expect(
                &mut f,
                "extend Duration::MAX",
                guard.extend(Duration::MAX).await,
                "InvalidArgument",
                invalid_argument,
            );
            if !matches!(guard.is_owned().await, Ok(true)) {
                f.push("a refused extend lost the lock".into());
            }
            if monitor {
                if !matches!(locks.force_release(&name).await, Ok(true)) {
                    f.push("force_release of a held lock did not report it".into());
                }
                expect(
                    &mut f,
                    "extend after break",
                    guard.extend(short).await,
                    "NotOwned",
                    not_owned,
                );
                expect(
                    &mut f,
                    "release after break",
                    guard.release().await,
                    "NotOwned",
                    not_owned,
                );
            } else {
                guard
                    .release()
                    .await
                    .unwrap_or_else(|e| f.push(format!("release: {e}")));
            }
        }
        Err(error) => f.push(format!("acquire {name}: {error}")),
    }

    // Tricky but valid names round-trip: held, seen under their exact name, listed under the
    // prefix (and only there: wildcards in a prefix are literal), released.
    let max_len = format!("{prefix}{}", "m".repeat(MAX_NAME_LEN - prefix.len()));
    let multibyte = format!("{prefix}{}", "é".repeat((MAX_NAME_LEN - prefix.len()) / 2));
    let tricky = [
        format!("{prefix}a//b"),
        format!("{prefix}.."),
        format!("{prefix}."),
        format!("{prefix}trailing/"),
        format!("{prefix} "),
        format!("{prefix}%"),
        format!("{prefix}_"),
        format!("{prefix}*?[x]"),
        format!("{prefix}line\nbreak"),
        format!("{prefix}ünï/cødé"),
        format!("{prefix}Case"),
        format!("{prefix}case"),
        max_len,
        multibyte,
    ];
    for tricky_name in &tricky {
        let shown: String = tricky_name.chars().skip(prefix.len()).take(20).collect();
        let guard = match locks
            .mutex(tricky_name.clone())
            .ttl(short)
            .no_wait()
            .acquire()
            .await
        {
            Ok(guard) => guard,
            Err(error) if invalid_name(&error) => continue, // refused by name: fine, typed
            Err(error) => {
                f.push(format!("acquire {shown:?}: {error}"));
                continue;
            }
        };
        match held_by_probe(tricky_name).await {
            Ok(Some(seen)) if &seen == tricky_name => {}
            other => f.push(format!("inspect {shown:?} while held: {other:?}")),
        }
        guard
            .release()
            .await
            .unwrap_or_else(|e| f.push(format!("release {shown:?}: {e}")));
        match held_by_probe(tricky_name).await {
            Ok(None) => {}
            other => f.push(format!("inspect {shown:?} after release: {other:?}")),
        }
    }
    for wildcard in ["%", "_", "*"].into_iter().filter(|_| list) {
        let holder = locks
            .mutex(format!("{prefix}plain"))
            .ttl(short)
            .no_wait()
            .acquire()
            .await;
        let listed: dlock::Result<Vec<dlock::LockInfo>> = locks
            .list(&format!("{prefix}{wildcard}"))
            .try_collect()
            .await;
        match listed {
            Ok(found) if found.is_empty() => {}
            other => f.push(format!(
                "list {wildcard:?} matched a lock it names no prefix of: {other:?}"
            )),
        }
        match holder {
            Ok(guard) => guard
                .release()
                .await
                .unwrap_or_else(|e| f.push(format!("release: {e}"))),
            Err(error) => f.push(format!("acquire {prefix}plain: {error}")),
        }
    }

    // Nothing left behind.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if list {
        let held: dlock::Result<Vec<dlock::LockInfo>> = locks.list(&prefix).try_collect().await;
        match held {
            Ok(held) if held.is_empty() => {}
            Ok(held) => f.push(format!(
                "locks left behind: {:?}",
                held.iter().map(|i| &i.name).collect::<Vec<_>>()
            )),
            Err(error) => f.push(format!("list after the matrix: {error}")),
        }
    }
    for left in std::iter::once(&name).chain(&tricky) {
        match held_by_probe(left).await {
            // A store that refuses a name (the file backend: `a//b`, `..`) holds nothing by it.
            Ok(None) => {}
            Err(error) if invalid_name(&error) => {}
            other => f.push(format!("{left:?} left held: {other:?}")),
        }
    }
    f.into_iter()
        .map(|failure| format!("{backend}: {failure}"))
        .collect()
}

fn assert_clean(failures: Failures) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The API matrix on every backend of this build, each on one server (the test kit's
/// `fixture::STARTERS`), all at once. A backend whose server is missing fails the test, unless
/// the build found that server missing too: it is then reported as not tested.
#[tokio::test(flavor = "multi_thread")]
async fn every_backend_api() {
    let enabled = tokio::task::spawn_blocking(|| {
        start_enabled(|starter| !starter.several_servers && !starter.masked)
    })
    .await
    .unwrap()
    .unwrap();
    let missing_at_build: Vec<&str> = env!("DLOCK_TEST_MISSING_AT_BUILD").split(',').collect();
    let mut failures = Failures::new();
    for missing in &enabled.missing {
        if missing_at_build.contains(&missing.server) {
            eprintln!(
                "{}: not tested, {} is not installed",
                missing.backend, missing.server
            );
        } else {
            failures.push(format!(
                "{}: {}",
                missing.backend,
                missing_now(missing.server)
            ));
        }
    }
    let tested: Vec<&str> = enabled.fixtures.iter().map(|fx| fx.backend()).collect();
    assert!(
        tested.contains(&"memory") && tested.contains(&"sqlite"),
        "{tested:?}"
    );
    let matrices = enabled.fixtures.iter().map(|fx| api_matrix(&**fx));
    for matrix in futures::future::join_all(matrices).await {
        failures.extend(matrix);
    }
    assert_clean(failures);
}

/// Every URL that cannot work is `InvalidUrl`, with any password redacted, before any I/O.
#[tokio::test]
async fn bad_urls_are_invalid_url() {
    let urls = [
        "",
        "locks.db",
        "://nothing",
        "carrier-pigeon://coop",
        "memory://a?bogus=1",
        "sqlite://",
        "sqlite:///tmp/x.db?busy_timeout=banana",
        "redis://",
        "redis://127.0.0.1:notaport",
        "redis://127.0.0.1:6379/notadb",
        "redis://127.0.0.1:6379?bogus=1",
        "redlock://",
        "redlock://127.0.0.1:1?quorum=9",
        "postgres://127.0.0.1/db?mode=bogus",
        "postgres://127.0.0.1/db?table=bad%20table",
        "mysql://127.0.0.1/db?mode=bogus",
        "mariadb://127.0.0.1/db?bogus=1",
        "etcd://",
        "etcd://127.0.0.1:2379?bogus=1",
        "zk://",
        "zk://127.0.0.1:2181/chroot?session_timeout=banana",
        "zk://127.0.0.1:2181/bad//chroot",
    ];
    let mut failures = Failures::new();
    for url in urls {
        match tokio::time::timeout(Duration::from_secs(10), dlock::connect(url)).await {
            Ok(Err(Error::InvalidUrl { .. })) => {}
            Ok(other) => failures.push(format!(
                "{url:?}: expected InvalidUrl, got {:?}",
                other.map(|_| "a client")
            )),
            Err(_) => failures.push(format!("{url:?}: still connecting after 10 s")),
        }
    }
    for url in [
        "redis://user:hunter2@127.0.0.1:6379?bogus=1",
        "postgres://user:hunter2@127.0.0.1/db?mode=bogus",
        "mysql://user:hunter2@127.0.0.1/db?mode=bogus",
    ] {
        match dlock::connect(url).await {
            Err(error @ Error::InvalidUrl { .. })
                if !format!("{error} {error:?}").contains("hunter2") => {}
            other => failures.push(format!(
                "{url:?}: expected a redacted InvalidUrl, got {:?}",
                other.map(|_| "a client")
            )),
        }
    }
    // The blocking facade answers the same.
    let blocking = std::thread::spawn(|| {
        (
            matches!(
                dlock::blocking::Locks::connect("carrier-pigeon://x"),
                Err(Error::InvalidUrl { .. })
            ),
            dlock::blocking::Locks::connect("memory://bad-input-blocking")
                .map(|locks| matches!(locks.mutex("").acquire(), Err(Error::InvalidName { .. }))),
        )
    })
    .join()
    .unwrap();
    if !blocking.0 || !matches!(blocking.1, Ok(true)) {
        failures.push(format!("blocking facade: {blocking:?}"));
    }
    assert_clean(failures);
}

/// A Redis key prefix with `{` or `}` would put a hash tag of its own before the lock's, so
/// the keys of one lock could land in different Cluster slots (and every lock in one slot):
/// refused before any I/O, in the URL and in the builder, naming the option and never the
/// password.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redis_prefix_with_a_brace_is_refused() {
    let mut failures = Failures::new();
    for url in [
        "redis://u:hunter2@127.0.0.1:6379?prefix=app{1}:",
        "redis://u:hunter2@127.0.0.1:6379?prefix=%7Bapp",
        "redis+cluster://u:hunter2@127.0.0.1:7000?prefix=app}",
        "redis+sentinel://u:hunter2@127.0.0.1/orders?prefix=%7D",
    ] {
        match tokio::time::timeout(Duration::from_secs(10), dlock::connect(url)).await {
            Ok(Err(error @ Error::InvalidUrl { .. }))
                if error.to_string().contains("prefix")
                    && !format!("{error} {error:?}").contains("hunter2") => {}
            Ok(other) => failures.push(format!(
                "{url:?}: expected InvalidUrl naming `prefix`, redacted, got {:?}",
                other.map(|_| "a client")
            )),
            Err(_) => failures.push(format!("{url:?}: still connecting after 10 s")),
        }
    }
    for prefix in ["{app}:", "app:{", "}"] {
        let built = dlock::redis::RedisBuilder::new("redis://u:hunter2@127.0.0.1:1")
            .unwrap()
            .prefix(prefix)
            .build()
            .await;
        match built {
            Err(Error::InvalidArgument {
                what: "prefix",
                reason,
            }) if !reason.contains("hunter2") => {}
            other => failures.push(format!(
                "builder prefix {prefix:?}: expected InvalidArgument for `prefix`, got {:?}",
                other.map(|_| "a backend")
            )),
        }
    }
    assert_clean(failures);
}

/// The CLI: bad arguments exit non-zero with a message naming the problem, never panic, and
/// leave no lock. (The common cases are in `dlock-cli/tests/cli.rs`; these add the rest:
/// arguments that are not UTF-8, bad durations and options per command, unreachable stores.)
#[test]
fn cli_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    let not_utf8 = OsStr::from_bytes(b"name-\xff");
    let long_prefix = "p".repeat(600);
    let long_name = "n".repeat(513);
    type Case<'a> = (Vec<&'a OsStr>, i32, &'a str);
    fn s(text: &str) -> &OsStr {
        OsStr::new(text)
    }
    let cases: Vec<Case<'_>> = vec![
        (
            vec![s("run"), not_utf8, s("--"), s("true")],
            2,
            "invalid UTF-8",
        ),
        (vec![s("hold"), not_utf8], 2, "invalid UTF-8"),
        (vec![s("inspect"), not_utf8], 2, "invalid UTF-8"),
        (vec![s("break"), s("--yes"), not_utf8], 2, "invalid UTF-8"),
        (vec![s("ls"), not_utf8], 2, "invalid UTF-8"),
        (vec![s("--label"), not_utf8, s("ls")], 2, "invalid UTF-8"),
        (
            vec![s("run"), s("--wait"), s("-1s"), s("x"), s("--"), s("true")],
            2,
            "is negative",
        ),
        (
            vec![
                s("run"),
                s("--kill-after"),
                s("nope"),
                s("x"),
                s("--"),
                s("true"),
            ],
            2,
            "examples: 500ms",
        ),
        (
            vec![
                s("run"),
                s("--on-lost"),
                s("bogus"),
                s("x"),
                s("--"),
                s("true"),
            ],
            2,
            "invalid value",
        ),
        (
            vec![s("hold"), s("--ttl"), s("40days"), s("x")],
            125,
            "maximum",
        ),
        (
            vec![s("run"), s("--ttl"), s("5ms"), s("x"), s("--"), s("true")],
            125,
            "below the minimum",
        ),
        (vec![s("ls"), s(&long_prefix)], 125, "longer than 512"),
        (vec![s("inspect"), s(&long_name)], 125, "longer than 512"),
        (vec![s("break"), s("--yes"), s("")], 125, "name is empty"),
        (vec![s("ls"), s("--bogus")], 2, "unexpected argument"),
        (vec![s("inspect")], 2, "<NAME>"),
        (vec![s("hold")], 2, "<NAME>"),
    ];
    let mut failures = Failures::new();
    for (args, code, message) in cases {
        let out = dlock_testkit::cli::dlock_command(&url)
            .unwrap()
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(code) || !err.contains(message) || err.contains("panicked") {
            failures.push(format!(
                "{args:?}: exit {:?}, wanted {code} and {message:?} in: {err}",
                out.status.code()
            ));
        }
    }
    // URLs the CLI cannot use: exit 125 with the reason, passwords redacted, nothing hangs.
    for (bad_url, message) in [
        ("", "expected SCHEME://"),
        ("redis://127.0.0.1:1", "unavailable"),
        ("postgres://u:hunter2@127.0.0.1:1/db?mode=bogus", "mode"),
    ] {
        let out = dlock_testkit::cli::dlock_command(bad_url)
            .unwrap()
            .args(["inspect", "x"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(125) || !err.contains(message) || err.contains("hunter2") {
            failures.push(format!(
                "--url {bad_url:?}: exit {:?}: {err}",
                out.status.code()
            ));
        }
    }
    let out = dlock_testkit::cli::dlock_command(&url)
        .unwrap()
        .args(["ls", "--json"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || listed.trim() != "[]" {
        failures.push(format!("locks left behind: {listed}"));
    }
    assert_clean(failures);
}

/// A password (or token) written in any of the forms users write reaches neither an error's
/// message, its source chain nor its `Debug` form, for every scheme, whether the URL is
/// malformed, has a bad option, or points at a closed port.
#[tokio::test]
async fn no_secret_reaches_an_error_message() {
    const SECRET: &str = "Pw-s3cret";
    let urls = [
        format!("redis://:{SECRET}@127.0.0.1:1"),
        format!("redis://u:pa/{SECRET}@127.0.0.1:1"),
        format!("redis://u:{SECRET}@127.0.0.1:1/0?bogus=1"),
        format!("redis://u:{SECRET}@127.0.0.1:notaport"),
        format!("rediss://u:{SECRET}@127.0.0.1:1?connect_timeout=200ms"),
        format!(
            "redlock://u:{SECRET}@127.0.0.1:1,u:{SECRET}@127.0.0.1:2,u:{SECRET}@127.0.0.1:3?bogus=1"
        ),
        format!("redlock://u:{SECRET}@127.0.0.1:1,u:{SECRET}@127.0.0.1:2,u:{SECRET}@127.0.0.1:3"),
        format!("postgres://app@127.0.0.1:1/db?password={SECRET}&x=1"),
        format!("postgres://app:{SECRET}@127.0.0.1:1/db?connect_timeout=200ms"),
        format!("postgres://app:{SECRET}@127.0.0.1:1/db?bogus=1"),
        format!("mysql://root:{SECRET}@127.0.0.1:1/db"),
        format!("mysql://root@127.0.0.1:1/db?password={SECRET}"),
        format!("mariadb://root:pa/{SECRET}@127.0.0.1:1/db"),
        format!("etcd://u:{SECRET}@127.0.0.1:1?bogus=1"),
        format!("etcd://u:{SECRET}@127.0.0.1:1?connect_timeout=200ms"),
        format!("zk://u:{SECRET}@127.0.0.1:1?bogus=1"),
        format!("zk://u:{SECRET}@127.0.0.1:1?connect_timeout=200ms"),
        format!("sqlite:///nonexistent-dir/x.db?password={SECRET}"),
        format!("carrier-pigeon://u:{SECRET}@coop"),
        format!("u:{SECRET}@127.0.0.1:6379"),
    ];
    let mut failures = Failures::new();
    for url in &urls {
        let result = tokio::time::timeout(Duration::from_secs(20), dlock::connect(url)).await;
        let error = match result {
            Ok(Ok(locks)) => {
                // A lazy client fails on first use instead.
                match locks.inspect("x").await {
                    Ok(_) => {
                        failures.push(format!("{url}: no error at all"));
                        continue;
                    }
                    Err(e) => e,
                }
            }
            Ok(Err(e)) => e,
            Err(_) => {
                failures.push("a connect with a closed port hung for 20 s".to_owned());
                continue;
            }
        };
        let mut shown = format!("{error} | {error:?}");
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            shown.push_str(&format!(" | {cause} | {cause:?}"));
            source = cause.source();
        }
        if shown.contains(SECRET) || shown.contains("s3cret") {
            failures.push(format!("leaked: {shown}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
