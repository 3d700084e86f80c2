//! For the tests only: which real servers this machine has. The store tests of a server that
//! is missing are then reported as ignored, with the reason, instead of passing without
//! running (`#[cfg_attr(dlock_test_missing = "redis", ignore = "…")]`). When
//! `DLOCK_TEST_REQUIRE` asks for a server, it is never marked missing, so its tests run and
//! fail loudly. `DLOCK_TEST_MISSING_AT_BUILD` names the same servers for the tests to read
//! (`dlock_testkit::require::check_build`), so a run that requires one of them fails instead
//! of reporting its tests as ignored. The library itself does not read these flags.
//!
//! For the library: `dlock_all_backends` when every backend feature is on (code that several
//! backends share, each using part of it, allows dead code in any other build; the full
//! build, which CI lints, uses all of it), and `dlock_any_backend` when any backend beyond
//! memory is on. The backend features are read from the driver table, whose `DRIVERS` and
//! `NOT_BUILT` this script also writes for `registry.rs` (`build/drivers.rs`); the servers
//! are read from the test kit's `ServerKind` impls (`build/servers.rs`).

use std::path::{Path, PathBuf};

#[path = "build/drivers.rs"]
mod drivers;
#[path = "build/servers.rs"]
mod servers;

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn found(binary: &str, env: &str, extra: &[String]) -> bool {
    if let Some(value) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(&value);
        if path.components().count() > 1 {
            return executable(&path);
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from));
    dirs.extend(extra.iter().map(PathBuf::from));
    if binary == "postgres" {
        // Debian keeps the server outside PATH, one folder per major version.
        if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
            dirs.extend(entries.flatten().map(|e| e.path().join("bin")));
        }
    }
    dirs.iter().any(|dir| executable(&dir.join(binary)))
}

fn required(name: &str) -> bool {
    std::env::var("DLOCK_TEST_REQUIRE").is_ok_and(|list| {
        list.split(',')
            .map(str::trim)
            .any(|item| item.eq_ignore_ascii_case("all") || item.eq_ignore_ascii_case(name))
    })
}

/// The driver table's entries (`src/<backend>/driver.rs`), in the order of the `full`
/// feature; `registry.rs` includes the `DRIVERS` and `NOT_BUILT` written from them.
fn driver_table(manifest_dir: &Path) -> Vec<drivers::DriverEntry> {
    let src = manifest_dir.join("src");
    // A new backend folder, or a driver's entry changed.
    println!("cargo::rerun-if-changed={}", src.display());
    println!("cargo::rerun-if-changed=Cargo.toml");
    let manifest = std::fs::read_to_string(manifest_dir.join("Cargo.toml")).unwrap_or_default();
    let table = drivers::read(&src, &drivers::full_features(&manifest));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let mut files = vec![("drivers.rs".to_owned(), drivers::generated(&table))];
    for kind in drivers::DOC_KINDS {
        // Every backend's URLs and feature are documented; only the built ones are linked.
        let list = drivers::doc_list(&table, kind, |driver| {
            kind != "backend" || driver.feature.as_deref().is_none_or(feature_on)
        });
        files.push((format!("docs_{kind}.md"), list));
    }
    for (name, text) in files {
        // A file not written fails the build where `registry.rs` or `lib.rs` includes it.
        if let Err(error) = std::fs::write(out.join(&name), text) {
            println!("cargo::warning=writing OUT_DIR/{name}: {error}");
        }
    }
    table
}

/// The test kit's servers (`crates/dlock-testkit/src/server/`), read from their
/// `ServerKind` impls.
fn test_servers(manifest_dir: &Path) -> Vec<servers::ServerRow> {
    let folder = manifest_dir.join("../dlock-testkit/src/server");
    // Absent from the published crate; a watched path that does not exist would rerun this
    // script on every build.
    if folder.is_dir() {
        println!("cargo::rerun-if-changed={}", folder.display());
    }
    servers::read(&folder)
}

/// Whether this build turns the cargo feature on.
fn feature_on(feature: &str) -> bool {
    let var = format!("CARGO_FEATURE_{}", feature.to_uppercase().replace('-', "_"));
    std::env::var_os(var).is_some()
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(dlock_all_backends, dlock_any_backend)");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut features: Vec<String> = Vec::new();
    for feature in driver_table(&manifest_dir)
        .into_iter()
        .filter_map(|d| d.feature)
    {
        if !features.contains(&feature) {
            features.push(feature);
        }
    }
    if !features.is_empty() && features.iter().all(|f| feature_on(f)) {
        println!("cargo::rustc-cfg=dlock_all_backends");
    }
    if features.iter().any(|f| feature_on(f)) {
        println!("cargo::rustc-cfg=dlock_any_backend");
    }
    let servers = test_servers(&manifest_dir);
    let names: Vec<String> = servers.iter().map(|s| format!("\"{}\"", s.name)).collect();
    println!(
        "cargo::rustc-check-cfg=cfg(dlock_test_missing, values({}))",
        names.join(", ")
    );
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=DLOCK_TEST_REQUIRE");
    println!("cargo::rerun-if-env-changed=DLOCK_TEST_ZOOKEEPER_JAR");
    let mut missing = Vec::new();
    for server in &servers {
        let (name, binary, extra) = (server.name.as_str(), server.binary.as_str(), &server.dirs);
        let env = format!("DLOCK_TEST_{}_BIN", name.to_uppercase().replace('-', "_"));
        println!("cargo::rerun-if-env-changed={env}");
        let mut present = found(binary, &env, extra);
        if name == "zookeeper" {
            let jar = std::env::var_os("DLOCK_TEST_ZOOKEEPER_JAR")
                .filter(|v| !v.is_empty())
                .map_or_else(
                    || PathBuf::from("/usr/share/java/zookeeper.jar"),
                    PathBuf::from,
                );
            println!("cargo::rerun-if-changed={}", jar.display());
            present &= jar.is_file();
        }
        // Installing the server later must rebuild the tests with the flag gone. A path that
        // does not exist would make this script always stale (every build rebuilding dlock),
        // so the binary is watched where it is, or else the folders it would be installed in.
        let installed = ["/usr/bin", "/usr/sbin"]
            .into_iter()
            .chain(extra.iter().map(String::as_str))
            .map(|dir| Path::new(dir).join(binary))
            .find(|path| path.exists());
        match installed {
            Some(path) => println!("cargo::rerun-if-changed={}", path.display()),
            None => ["/usr/bin", "/usr/sbin", "/usr/lib/postgresql"]
                .iter()
                .filter(|dir| Path::new(dir).is_dir())
                .for_each(|dir| println!("cargo::rerun-if-changed={dir}")),
        }
        if !present && !required(name) {
            println!("cargo::rustc-cfg=dlock_test_missing=\"{name}\"");
            missing.push(name);
        }
    }
    // The same list, readable at run time (`env!`): a run whose `DLOCK_TEST_REQUIRE` asks for
    // a server this build marked missing would otherwise see its tests ignored, not failed.
    println!(
        "cargo::rustc-env=DLOCK_TEST_MISSING_AT_BUILD={}",
        missing.join(",")
    );
}
