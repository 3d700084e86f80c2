//! What a `#[test]` that needs a real server does when the server is missing: it is reported
//! as ignored, or it fails; it never returns early and passes.
//!
//! dlock's build script marks the tests of a server it cannot find as ignored
//! (`#[cfg_attr(dlock_test_missing = "redis", ignore = "…")]`), unless `DLOCK_TEST_REQUIRE`
//! asks for that server. That decision is taken when the test binary is built, and two runs
//! slip past it:
//!
//! - the build found the server and the run does not (another machine, a changed `PATH` or
//!   `DLOCK_TEST_<NAME>_BIN`): the test was compiled to run, so [`present`] makes the missing
//!   server an error;
//! - the build marked a server missing and the run's `DLOCK_TEST_REQUIRE` asks for it: its
//!   tests were compiled as ignored and cannot run, so one test per binary fails instead
//!   ([`crate::fail_if_a_required_server_was_missing_at_build`]).
//!
//! The conformance and safety suites (libtest-mimic) decide at run time and need neither.

use anyhow::{anyhow, ensure};

/// The started fixture or server of a test the build did not mark ignored, or an error
/// when it is missing: the build found `server`, so a run without it must fail.
///
/// `started` is what a test kit `start` returns: `Ok(None)` when the server is not installed
/// and the run does not require it.
///
/// # Errors
///
/// `started` failed, or the server is missing now.
pub fn present<T>(server: &str, started: anyhow::Result<Option<T>>) -> anyhow::Result<T> {
    started?.ok_or_else(|| missing_now(server))
}

/// The error of a server missing at run time that was found when the test binary was built.
pub fn missing_now(server: &str) -> anyhow::Error {
    anyhow!(
        "{server}: not found, but it was when this test binary was built, so its tests were \
         not marked ignored; install it, point DLOCK_TEST_{}_BIN at it, or rebuild the tests",
        server.to_ascii_uppercase()
    )
}

/// Fails when `DLOCK_TEST_REQUIRE` requires a server that `missing_at_build` names: the
/// comma-separated servers the test binary's build marked missing (the build script's
/// `DLOCK_TEST_MISSING_AT_BUILD`), whose tests were compiled as ignored.
///
/// # Errors
///
/// Names the required servers whose tests this build ignores.
pub fn check_build(missing_at_build: &str) -> anyhow::Result<()> {
    check_build_against(missing_at_build, crate::server::required)
}

/// [`check_build`] with the rule for which servers the run requires passed in.
fn check_build_against(
    missing_at_build: &str,
    required: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let ignored: Vec<&str> = missing_at_build
        .split(',')
        .filter(|server| !server.is_empty() && required(server))
        .collect();
    ensure!(
        ignored.is_empty(),
        "DLOCK_TEST_REQUIRE requires {0}, but this test binary was built while {0} was \
         missing, so its tests are compiled as ignored: rebuild the tests with \
         DLOCK_TEST_REQUIRE set (cargo rebuilds them when it changes)",
        ignored.join(", ")
    );
    Ok(())
}

/// Defines the `#[test]` `a_required_server_was_not_missing_at_build` in the calling test
/// binary: it fails when the run's `DLOCK_TEST_REQUIRE` requires a server whose tests this
/// binary's build marked ignored (see [`check_build`]). The calling crate's build script must
/// set `DLOCK_TEST_MISSING_AT_BUILD`, as dlock's does.
#[macro_export]
macro_rules! fail_if_a_required_server_was_missing_at_build {
    () => {
        #[test]
        fn a_required_server_was_not_missing_at_build() {
            $crate::require::check_build(env!("DLOCK_TEST_MISSING_AT_BUILD")).unwrap();
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_fixture_is_an_error_that_names_the_server() {
        let error = present::<()>("redis", Ok(None)).unwrap_err().to_string();
        assert!(error.contains("redis: not found"), "{error}");
        assert!(error.contains("DLOCK_TEST_REDIS_BIN"), "{error}");
        assert_eq!(present("redis", Ok(Some(7))).unwrap(), 7);
    }

    #[test]
    fn a_build_that_missed_no_required_server_passes_the_check() {
        check_build_against("", |_| true).unwrap();
        check_build_against("etcd,zookeeper", |server| server == "redis").unwrap();
    }

    #[test]
    fn a_build_that_missed_a_required_server_fails_the_check_naming_it() {
        let error = check_build_against("redis,etcd", |server| server == "etcd")
            .unwrap_err()
            .to_string();
        assert!(error.contains("requires etcd"), "{error}");
        assert!(!error.contains("redis"), "{error}");
    }
}
