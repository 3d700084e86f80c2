//! The real servers the tests start, read from the test kit's `ServerKind` impls
//! (`crates/dlock-testkit/src/server/*.rs`): a build script cannot link the test kit, so it
//! reads each top-level `impl ServerKind for …` block's `name`, `binary` and the literal
//! folders of `search_dirs`. A store with a server then needs no line in the build script.
//! The test kit includes this file in its own tests, to check it finds every starter's server.

use std::path::Path;

/// One kind of server as its `ServerKind` impl states it.
#[derive(Debug, Default)]
pub(crate) struct ServerRow {
    /// `fn name`: also the `DLOCK_TEST_<NAME>_BIN` override and the `dlock_test_missing` value.
    pub(crate) name: String,
    /// `fn binary`.
    pub(crate) binary: String,
    /// The literal paths in `fn search_dirs` (absolute, or relative to a crate of `crates/`).
    pub(crate) dirs: Vec<String>,
}

/// The string literals of a line (no escapes: names and paths here have none).
fn literals(line: &str) -> impl Iterator<Item = &str> {
    line.split('"').skip(1).step_by(2)
}

/// The servers of one file's top-level `impl ServerKind for …` blocks (those inside test
/// modules are indented, and left out).
pub(crate) fn parse(text: &str) -> Vec<ServerRow> {
    let mut rows = Vec::new();
    let mut row: Option<ServerRow> = None;
    let mut method = "";
    for line in text.lines() {
        if line.starts_with("impl ServerKind for ") {
            row = Some(ServerRow::default());
            continue;
        }
        let Some(current) = row.as_mut() else {
            continue;
        };
        if line == "}" {
            rows.extend(
                row.take()
                    .filter(|r| !r.name.is_empty() && !r.binary.is_empty()),
            );
            continue;
        }
        if let Some(signature) = line.strip_prefix("    fn ") {
            method = signature.split('(').next().unwrap_or_default();
        }
        for literal in literals(line) {
            match method {
                "name" if current.name.is_empty() => current.name = literal.to_owned(),
                "binary" if current.binary.is_empty() => current.binary = literal.to_owned(),
                "search_dirs" if literal.starts_with('/') || literal.starts_with("../") => {
                    current.dirs.push(literal.to_owned());
                }
                _ => {}
            }
        }
    }
    rows
}

/// Every server of the test kit's server folder, one row per name (the first file in name
/// order that states it); none when the folder is absent (the published crate).
pub(crate) fn read(folder: &Path) -> Vec<ServerRow> {
    let mut files: Vec<_> = std::fs::read_dir(folder)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut rows: Vec<ServerRow> = Vec::new();
    for text in files.iter().filter_map(|f| std::fs::read_to_string(f).ok()) {
        for row in parse(&text) {
            if !rows.iter().any(|known| known.name == row.name) {
                rows.push(row);
            }
        }
    }
    rows
}
