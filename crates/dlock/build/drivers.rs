//! The driver table as the build script reads it: each `src/<backend>/driver.rs`'s cargo
//! feature and schemes, read from the file's text (a build script cannot link the
//! library). From them it writes `registry.rs`'s `DRIVERS` and `NOT_BUILT` (`drivers.rs` in
//! `OUT_DIR`), so a new backend's folder needs no line in the registry.

use std::path::Path;

/// One backend's entry, as its `driver.rs` states it.
pub(crate) struct DriverEntry {
    /// The folder under `src/`, which is also the module's name.
    pub(crate) module: String,
    /// `feature: Some("…")`; `None` for a backend that is always built.
    pub(crate) feature: Option<String>,
    /// `schemes: &[…]`, or the `const` of the folder that `schemes: super::…` names.
    pub(crate) schemes: Vec<String>,
    /// Its lines of the crate docs: `//! KIND: TEXT` in its `driver.rs` (see [`DOC_KINDS`]).
    pub(crate) docs: Vec<(String, String)>,
}

/// The crate docs' lists a driver has lines in, each written to `OUT_DIR/docs_KIND.md` for
/// `lib.rs` to include: the URL table, `connect`'s table, the backends (built ones only), the
/// cargo features.
pub(crate) const DOC_KINDS: [&str; 4] = ["url", "connect", "backend", "feature"];

/// The `//! KIND: TEXT` lines of a `driver.rs`.
fn doc_lines(text: &str) -> Vec<(String, String)> {
    let mut docs = Vec::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("//! ")) {
        for kind in DOC_KINDS {
            if let Some(rest) = line.strip_prefix(kind).and_then(|r| r.strip_prefix(": ")) {
                docs.push((kind.to_owned(), rest.to_owned()));
            }
        }
    }
    docs
}

/// One list of the crate docs: the lines of `kind` of the drivers `built` keeps, in table
/// order.
pub(crate) fn doc_list(
    drivers: &[DriverEntry],
    kind: &str,
    built: impl Fn(&DriverEntry) -> bool,
) -> String {
    let mut out = String::new();
    for driver in drivers.iter().filter(|d| built(d)) {
        for (_, text) in driver.docs.iter().filter(|(k, _)| k == kind) {
            out.push_str(text);
            out.push('\n');
        }
    }
    out
}

/// The string literals of `text`, in order (no escapes: names, schemes and paths have none).
pub(crate) fn literals(text: &str) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The text of `text` after the first `marker`.
fn after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    text.find(marker).map(|at| &text[at + marker.len()..])
}

/// The literals of the slice that starts `text` (`&["a","b"]…`), up to its `]`.
fn slice_literals(text: &str) -> Vec<String> {
    literals(text.split(']').next().unwrap_or_default())
}

/// The schemes of a driver: a literal slice, or a `const` of its folder named by
/// `super::NAME` (`pub const NAME: &[&str] = &[…];` in any file of the folder).
fn schemes(driver: &str, folder: &Path) -> Vec<String> {
    let Some(value) = after(driver, "schemes:") else {
        return Vec::new();
    };
    if value.starts_with("&[") {
        return slice_literals(value);
    }
    let Some(constant) = value.strip_prefix("super::") else {
        return Vec::new();
    };
    let constant: String = constant
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let definition = format!("const{constant}:&[&str]=&[");
    files(folder)
        .iter()
        .find_map(|text| after(text, &definition).map(slice_literals))
        .unwrap_or_default()
}

/// The texts of the `.rs` files of a folder and its subfolders, without whitespace.
fn files(folder: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut texts = Vec::new();
    for path in entries.flatten().map(|entry| entry.path()) {
        if path.is_dir() {
            texts.extend(files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs")
            && let Ok(text) = std::fs::read_to_string(&path)
        {
            texts.push(text.split_whitespace().collect());
        }
    }
    texts
}

/// Reads the entry of one backend folder, `None` when it has no `driver.rs`.
fn entry(folder: &Path) -> Option<DriverEntry> {
    let source = std::fs::read_to_string(folder.join("driver.rs")).ok()?;
    let text: String = source.split_whitespace().collect();
    let fields = after(&text, "Driver{")?;
    let feature = after(fields, "feature:")?;
    let feature = match feature.strip_prefix("Some(") {
        Some(rest) => Some(literals(rest).into_iter().next()?),
        None => None,
    };
    let module = folder.file_name()?.to_str()?.to_owned();
    let schemes = schemes(fields, folder);
    Some(DriverEntry {
        module,
        feature,
        schemes,
        docs: doc_lines(&source),
    })
}

/// Every backend folder's entry, in the order the table lists them: the backend with no
/// feature (memory) first, then by the place of its feature in the `full` feature's list
/// (`full`), folders of one feature by name.
pub(crate) fn read(src: &Path, full: &[String]) -> Vec<DriverEntry> {
    let mut folders: Vec<_> = std::fs::read_dir(src)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    folders.sort();
    let mut drivers: Vec<DriverEntry> = folders.iter().filter_map(|f| entry(f)).collect();
    let rank = |driver: &DriverEntry| match &driver.feature {
        None => 0,
        Some(feature) => full
            .iter()
            .position(|f| f == feature)
            .map_or(usize::MAX, |at| at + 1),
    };
    drivers.sort_by_key(|driver| rank(driver));
    drivers
}

/// The features of the `full` feature in `Cargo.toml`'s text, in order; its list may span
/// lines (`cargo package` writes one name a line).
pub(crate) fn full_features(manifest: &str) -> Vec<String> {
    let Some(at) = manifest.find("\nfull = [") else {
        return Vec::new();
    };
    let list = &manifest[at + "\nfull = [".len()..];
    literals(list.split(']').next().unwrap_or_default())
}

/// `registry.rs`'s `DRIVERS` and `not_built!` for these entries.
pub(crate) fn generated(drivers: &[DriverEntry]) -> String {
    let mut out = String::from(
        "// Written by build.rs (build/drivers.rs) from each src/<backend>/driver.rs.\n\n\
         /// The drivers this build has, in the order [`enabled_schemes`] and\n\
         /// [`enabled_backends`] list them: every `src/<backend>/driver.rs`, the backend\n\
         /// without a feature first, then in the order of the `full` feature's list.\n\
         const DRIVERS: &[Driver] = &[\n",
    );
    for driver in drivers {
        if let Some(feature) = &driver.feature {
            out.push_str(&format!("    #[cfg(feature = {feature:?})]\n"));
        }
        out.push_str(&format!("    crate::{}::driver::DRIVER,\n", driver.module));
    }
    out.push_str("];\n\nnot_built! {\n");
    for driver in drivers {
        if let Some(feature) = &driver.feature {
            let schemes: Vec<String> = driver.schemes.iter().map(|s| format!("{s:?}")).collect();
            out.push_str(&format!("    {feature:?} => [{}],\n", schemes.join(", ")));
        }
    }
    out.push_str("}\n");
    out
}
