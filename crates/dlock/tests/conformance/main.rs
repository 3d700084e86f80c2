//! The conformance suite on every backend this build enables.
//!
//! `cargo test -p dlock-rs --test conformance -- sqlite::` runs one backend (and starts only
//! its servers); `-- --ignored` lists nothing useful: ignored trials are the unsupported ones.
//! The fixtures are the test kit's list (`dlock_testkit::fixture::STARTERS`).

fn main() {
    dlock_testkit::conformance::main_enabled()
}
