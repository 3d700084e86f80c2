//! URL scheme → backend: the one place `connect` learns which stores this build has. A leaf:
//! it makes backends, and `Locks::connect` wraps them.
//!
//! Each backend module states its own entry, a [`Driver`] in its `driver.rs` (sqlx's
//! `URL_SCHEMES`, one per database); [`DRIVERS`] lists the built ones and [`NOT_BUILT`] the
//! others, both written by the build script from the `driver.rs` files (`build/drivers.rs`),
//! so a backend adds no line here. The scheme lists, `--version`'s backend list and the
//! schemes in `connect`'s docs all read this table (the tests below check the docs against it).

use futures::future::BoxFuture;

use crate::backend::{Capabilities, DynBackend};
use crate::error::{Error, Result, redact_url, scrub_secrets};

/// One backend as `connect` finds it by the URL's scheme.
pub(crate) struct Driver {
    /// The backend's name, as `dlock --version` lists it (one per driver however many
    /// schemes it answers to).
    pub(crate) name: &'static str,
    /// The cargo feature that builds it; `None` for memory, always built. Read by the build
    /// script (from this file's text) and the tests, not at run time.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) feature: Option<&'static str>,
    /// The URL schemes it serves, lowercase, the usual one first.
    pub(crate) schemes: &'static [&'static str],
    /// Its capabilities when every URL of it has the same ones (memory, SQLite); `None` where
    /// they depend on the URL (a SQL server's mode). The tests check a connected backend
    /// against it; nothing reads it at run time.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) capabilities: Option<Capabilities>,
    /// Opens the store at a URL of one of `schemes`.
    pub(crate) connect: fn(&str) -> BoxFuture<'_, Result<DynBackend>>,
}

/// A backend left out of this build: its cargo feature and schemes, so a URL of it is told
/// which feature to turn on rather than that its scheme is unknown.
struct NotBuilt {
    feature: &'static str,
    schemes: &'static [&'static str],
}

/// Declares [`NOT_BUILT`], each entry kept only in a build without its feature, and for the
/// tests every entry, to compare with [`DRIVERS`] in the build that has them all.
macro_rules! not_built {
    ($($feature:tt => [$($scheme:literal),+ $(,)?]),+ $(,)?) => {
        /// The backends this build lacks (a driver's schemes cannot be read from a module that
        /// is not built, so each optional driver's feature and schemes are repeated here;
        /// `not_built_repeats_each_optional_driver` checks them in the full build).
        const NOT_BUILT: &[NotBuilt] = &[$(
            #[cfg(not(feature = $feature))]
            NotBuilt { feature: $feature, schemes: &[$($scheme),+] },
        )+];

        #[cfg(test)]
        const EVERY_OPTIONAL: &[NotBuilt] = &[$(
            NotBuilt { feature: $feature, schemes: &[$($scheme),+] },
        )+];
    };
}

// `DRIVERS` (every backend folder's `driver.rs`, each behind its feature) and the
// `not_built!` list, written by the build script from the driver entries themselves.
include!(concat!(env!("OUT_DIR"), "/drivers.rs"));

/// The URL schemes this build can connect to, each backend's usual scheme first.
///
/// # Examples
///
/// ```
/// let schemes = dlock::enabled_schemes();
/// assert_eq!(schemes[0], "memory");
/// assert!(schemes.contains(&"sqlite") == cfg!(feature = "sqlite"));
/// ```
pub fn enabled_schemes() -> Vec<&'static str> {
    DRIVERS
        .iter()
        .flat_map(|driver| driver.schemes.iter().copied())
        .collect()
}

/// The backends this build has, one name each however many URL schemes it answers to
/// (`rediss` is `redis`, `zk` is `zookeeper`), in [`enabled_schemes`] order: what
/// `dlock --version` lists.
///
/// # Examples
///
/// ```
/// let backends = dlock::enabled_backends();
/// assert_eq!(backends[0], "memory");
/// assert!(!backends.contains(&"rediss"));
/// ```
pub fn enabled_backends() -> Vec<&'static str> {
    DRIVERS.iter().map(|driver| driver.name).collect()
}

pub(crate) async fn connect(url: &str) -> Result<DynBackend> {
    // Every backend redacts the URL it shows; a reason quoting a piece of a malformed URL
    // could still hold a password, so each reason is scrubbed here too.
    connect_scheme(url).await.map_err(|error| match error {
        Error::InvalidUrl { url: shown, reason } => Error::InvalidUrl {
            url: shown,
            reason: scrub_secrets(url, &reason),
        },
        other => other,
    })
}

async fn connect_scheme(url: &str) -> Result<DynBackend> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: redact_url(url),
        reason,
    };
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(invalid(
            "expected SCHEME://…, e.g. sqlite:///var/lib/app/locks.db or memory://".into(),
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    let scheme = scheme.as_str();
    if let Some(driver) = DRIVERS.iter().find(|d| d.schemes.contains(&scheme)) {
        return (driver.connect)(url).await;
    }
    let enabled = enabled_schemes().join(", ");
    Err(invalid(
        match NOT_BUILT.iter().find(|n| n.schemes.contains(&scheme)) {
            // Known, but its backend was left out of this build.
            Some(NotBuilt { feature, .. }) => format!(
                "the {feature} backend is not part of this build (cargo feature `{feature}`); \
                 enabled: {enabled}"
            ),
            None => format!("unknown scheme {scheme:?}; enabled: {enabled}"),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scheme named in the first column of the URL tables of the crate docs and of
    /// `connect`'s, per table: the rows the build script writes from the drivers' `url:` and
    /// `connect:` lines, which `lib.rs` includes.
    fn doc_tables() -> Vec<Vec<String>> {
        let lib = include_str!("lib.rs");
        let tables = [
            (
                "/docs_url.md",
                include_str!(concat!(env!("OUT_DIR"), "/docs_url.md")),
            ),
            (
                "/docs_connect.md",
                include_str!(concat!(env!("OUT_DIR"), "/docs_connect.md")),
            ),
        ];
        let mut schemes = Vec::new();
        for (file, rows) in tables {
            assert!(
                lib.contains(&format!("{file}\"))")),
                "lib.rs includes {file}"
            );
            let mut table: Vec<String> = Vec::new();
            for row in rows.lines() {
                let first = row
                    .trim_start_matches('|')
                    .split(" | ")
                    .next()
                    .unwrap_or_default();
                for piece in first.split('`').skip(1).step_by(2) {
                    if let Some((scheme, _)) = piece.split_once("://")
                        && !table.iter().any(|s| s == scheme)
                    {
                        table.push(scheme.to_owned());
                    }
                }
            }
            schemes.push(table);
        }
        schemes
    }

    #[test]
    fn the_url_tables_of_the_docs_name_every_scheme_and_no_other() {
        let tables = doc_tables();
        // The crate docs' "Connection URLs" and `connect`'s.
        assert_eq!(tables.len(), 2, "{tables:?}");
        let mut every: Vec<&str> = DRIVERS
            .iter()
            .flat_map(|d| d.schemes.iter().copied())
            .chain(NOT_BUILT.iter().flat_map(|n| n.schemes.iter().copied()))
            .collect();
        every.sort_unstable();
        for table in tables {
            let mut named: Vec<&str> = table.iter().map(String::as_str).collect();
            named.sort_unstable();
            assert_eq!(named, every, "a URL table in lib.rs's docs");
        }
    }

    #[cfg(dlock_all_backends)]
    #[test]
    fn not_built_repeats_each_optional_driver() {
        let optional: Vec<(&str, &[&str])> = DRIVERS
            .iter()
            .filter_map(|d| Some((d.feature?, d.schemes)))
            .collect();
        let repeated: Vec<(&str, &[&str])> = EVERY_OPTIONAL
            .iter()
            .map(|n| (n.feature, n.schemes))
            .collect();
        assert_eq!(optional, repeated);
        assert!(NOT_BUILT.is_empty());
    }

    /// The build script reads the table from the `driver.rs` files' text: in the full build,
    /// every backend folder's driver is in it, under the folder's name, with the schemes its
    /// `driver.rs` serves.
    #[cfg(dlock_all_backends)]
    #[test]
    fn the_table_has_the_driver_of_every_backend_folder() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut folders: Vec<String> = std::fs::read_dir(&src)
            .expect("src")
            .flatten()
            .filter(|entry| entry.path().join("driver.rs").is_file())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        folders.sort();
        let mut names: Vec<String> = DRIVERS.iter().map(|d| d.name.to_owned()).collect();
        names.sort();
        assert_eq!(names, folders);
        assert_eq!(DRIVERS[0].name, "memory");
        for driver in DRIVERS {
            assert!(!driver.schemes.is_empty(), "{}", driver.name);
        }
    }

    #[test]
    fn every_scheme_has_one_driver_and_is_lowercase() {
        let schemes = enabled_schemes();
        for scheme in &schemes {
            assert_eq!(*scheme, scheme.to_ascii_lowercase());
            assert_eq!(
                schemes.iter().filter(|s| *s == scheme).count(),
                1,
                "{scheme}"
            );
        }
        for built in &schemes {
            assert!(!NOT_BUILT.iter().any(|n| n.schemes.contains(built)));
        }
    }

    #[tokio::test]
    async fn a_driver_with_static_capabilities_connects_with_them() {
        #[cfg(feature = "sqlite")]
        let dir = tempfile_dir();
        let mut checked = 0;
        for driver in DRIVERS {
            let Some(capabilities) = driver.capabilities else {
                continue;
            };
            let url = match driver.name {
                "memory" => "memory://registry-test".to_owned(),
                #[cfg(feature = "sqlite")]
                "sqlite" => format!("sqlite://{}", dir.join("locks.db").display()),
                // A store with static capabilities and a server to connect to has no test here.
                _ => continue,
            };
            let backend = (driver.connect)(&url).await.expect("connect");
            assert_eq!(backend.info().capabilities, capabilities, "{}", driver.name);
            assert_eq!(backend.info().name, driver.name);
            checked += 1;
        }
        assert!(checked >= 1);
    }

    /// A fresh directory under the system's temp dir (the library has no tempfile dependency).
    #[cfg(feature = "sqlite")]
    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "dlock-registry-test-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }
}
