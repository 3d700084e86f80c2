//! The public API as a snapshot: every `pub` item, re-export and method a user of dlock can
//! reach, written out in `tests/public-api.txt`: the items of public modules (reached from
//! `lib.rs` through `pub mod` only), the items of private modules that a `pub use` re-exports,
//! and the impls of public types and of foreign types (never an impl of a private type, such
//! as a store's own lease). A change to the API shows up as a diff of that file
//! in review; this test fails until the file is updated (`DLOCK_BLESS=1 cargo test -p dlock-rs
//! --test public_api` writes it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::{ImplItem, Item, Visibility};

fn is_pub(vis: &Visibility) -> bool {
    matches!(vis, Visibility::Public(_))
}

/// `tokens` as one line, the way `syn` prints them.
fn text(tokens: &impl ToTokens) -> String {
    tokens.to_token_stream().to_string()
}

/// A function's signature without its body.
fn signature(sig: &syn::Signature) -> String {
    text(sig)
}

/// What the scan knows of the crate: the public names (items of public modules, names a
/// `pub use` exports) and every type or trait the crate declares.
#[derive(Default)]
struct Names {
    public: BTreeSet<String>,
    declared: BTreeSet<String>,
}

/// The name an item declares, for the items that are types, traits, functions or consts.
fn item_ident(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Fn(f) => &f.sig.ident,
        Item::Struct(s) => &s.ident,
        Item::Enum(e) => &e.ident,
        Item::Trait(t) => &t.ident,
        Item::Const(c) => &c.ident,
        Item::Type(t) => &t.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The names a `use` tree brings in (its leaves, or their renames).
fn use_leaves(tree: &syn::UseTree, out: &mut BTreeSet<String>) {
    match tree {
        syn::UseTree::Path(p) => use_leaves(&p.tree, out),
        syn::UseTree::Name(n) => {
            out.insert(n.ident.to_string());
        }
        syn::UseTree::Rename(r) => {
            out.insert(r.rename.to_string());
        }
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_leaves(t, out)),
        syn::UseTree::Glob(_) => {}
    }
}

/// The last identifier of a type's path (`&Foo<T>` → `Foo`); `None` for other types.
fn type_ident(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Type::Reference(r) => type_ident(&r.elem),
        _ => None,
    }
}

/// Whether an impl is part of the public API: its type is public, or foreign (not declared in
/// the crate) with a trait that is public or foreign too.
fn impl_is_public(item: &syn::ItemImpl, names: &Names) -> bool {
    let reachable = |ident: Option<String>| {
        ident.is_none_or(|i| names.public.contains(&i) || !names.declared.contains(&i))
    };
    let own = type_ident(&item.self_ty);
    if own.as_ref().is_some_and(|i| names.public.contains(i)) {
        return true;
    }
    let trait_ident = item
        .trait_
        .as_ref()
        .and_then(|(_, path, _)| path.segments.last().map(|s| s.ident.to_string()));
    own.as_ref().is_none_or(|i| !names.declared.contains(i)) && reachable(trait_ident)
}

/// Whether an item of a module is listed: every item of a public module, only the re-exported
/// ones of a private module; impls by [`impl_is_public`] in both; macros' digests everywhere.
fn listed(item: &Item, public_module: bool, names: &Names) -> bool {
    match item {
        Item::Impl(i) => impl_is_public(i, names),
        // A macro's digest wherever it is defined: a private macro may write public methods.
        Item::Macro(_) => true,
        Item::Mod(_) | Item::Use(_) => public_module,
        other => public_module || item_ident(other).is_some_and(|i| names.public.contains(&i)),
    }
}

/// Every public line of one module's items, prefixed with the module's path.
fn collect(
    module: &str,
    items: &[Item],
    public_module: bool,
    names: &Names,
    out: &mut BTreeSet<String>,
) {
    for item in items.iter().filter(|i| listed(i, public_module, names)) {
        match item {
            Item::Fn(f) if is_pub(&f.vis) => {
                out.insert(format!("{module} {}", signature(&f.sig)));
            }
            Item::Struct(s) if is_pub(&s.vis) => {
                let mut line = format!("{module} struct {}{}", s.ident, text(&s.generics));
                for field in s.fields.iter().filter(|f| is_pub(&f.vis)) {
                    let name = field.ident.as_ref().map_or("_".into(), |i| i.to_string());
                    let _ = write!(line, " | pub {name}: {}", text(&field.ty));
                }
                out.insert(line);
            }
            Item::Enum(e) if is_pub(&e.vis) => {
                let variants: Vec<String> = e.variants.iter().map(text).collect();
                out.insert(format!(
                    "{module} enum {} {{ {} }}",
                    e.ident,
                    variants.join(", ")
                ));
            }
            Item::Trait(t) if is_pub(&t.vis) => {
                out.insert(format!("{module} trait {}", t.ident));
                for item in &t.items {
                    if let syn::TraitItem::Fn(f) = item {
                        out.insert(format!("{module} trait {} {}", t.ident, signature(&f.sig)));
                    }
                }
            }
            Item::Const(c) if is_pub(&c.vis) => {
                out.insert(format!("{module} const {}: {}", c.ident, text(&c.ty)));
            }
            Item::Type(t) if is_pub(&t.vis) => {
                out.insert(format!("{module} type {} = {}", t.ident, text(&t.ty)));
            }
            Item::Use(u) if is_pub(&u.vis) => {
                out.insert(format!("{module} use {}", text(&u.tree)));
            }
            Item::Mod(m) if is_pub(&m.vis) => {
                out.insert(format!("{module} mod {}", m.ident));
                if let Some((_, inner)) = &m.content {
                    collect(&format!("{module}::{}", m.ident), inner, true, names, out);
                }
            }
            Item::Impl(i) if i.trait_.is_none() => {
                let target = text(&i.self_ty);
                for item in &i.items {
                    if let ImplItem::Fn(f) = item
                        && is_pub(&f.vis)
                    {
                        out.insert(format!("{module} impl {target} {}", signature(&f.sig)));
                    }
                    // Methods a macro writes: the call here, the macro's text below.
                    if let ImplItem::Macro(m) = item {
                        out.insert(format!("{module} impl {target} {}", text(&m.mac)));
                    }
                    if let ImplItem::Const(c) = item
                        && is_pub(&c.vis)
                    {
                        out.insert(format!("{module} impl {target} const {}", c.ident));
                    }
                }
            }
            Item::Impl(i) => {
                if let Some((_, path, _)) = &i.trait_ {
                    out.insert(format!(
                        "{module} impl {} for {}",
                        text(path),
                        text(&i.self_ty)
                    ));
                }
            }
            Item::Macro(m) if m.ident.is_some() => {
                let exported = m.attrs.iter().any(|a| a.path().is_ident("macro_export"));
                if exported {
                    out.insert(format!("{module} macro {}", text(&m.ident)));
                }
                // A macro may write public methods (builder setters): any change to its text
                // changes this line.
                out.insert(format!(
                    "{module} macro_rules {} {:016x}",
                    text(&m.ident),
                    fnv1a(&text(&m.mac.tokens))
                ));
            }
            _ => {}
        }
    }
}

/// FNV-1a: a digest that stays the same across Rust releases (std's hasher does not promise to).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The module path of a source file: `src/redis/mod.rs` → `dlock::redis`.
fn module_of(src: &Path, file: &Path) -> anyhow::Result<String> {
    let relative = file.strip_prefix(src)?;
    let mut parts = vec!["dlock".to_owned()];
    for part in relative.with_extension("").iter() {
        let part = part.to_string_lossy();
        if part != "mod" && part != "lib" {
            parts.push(part.into_owned());
        }
    }
    Ok(parts.join("::"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The file modules reachable from `lib.rs` through `pub mod` declarations only.
fn public_modules(modules: &BTreeMap<String, Vec<Item>>) -> BTreeSet<String> {
    let mut public = BTreeSet::from(["dlock".to_owned()]);
    let mut todo = vec!["dlock".to_owned()];
    while let Some(module) = todo.pop() {
        for item in modules.get(&module).into_iter().flatten() {
            if let Item::Mod(m) = item
                && is_pub(&m.vis)
                && m.content.is_none()
            {
                let child = format!("{module}::{}", m.ident);
                if public.insert(child.clone()) {
                    todo.push(child);
                }
            }
        }
    }
    public
}

/// The public and the declared names of the crate's modules.
fn names(modules: &BTreeMap<String, Vec<Item>>, public: &BTreeSet<String>) -> Names {
    let mut names = Names::default();
    for (module, items) in modules {
        for item in items {
            if let Some(ident) = item_ident(item) {
                names.declared.insert(ident.clone());
                if public.contains(module) && item_is_pub(item) {
                    names.public.insert(ident);
                }
            } else if let Item::Use(u) = item
                && is_pub(&u.vis)
            {
                use_leaves(&u.tree, &mut names.public);
            }
        }
    }
    names
}

/// Whether an item that declares a name is `pub`.
fn item_is_pub(item: &Item) -> bool {
    match item {
        Item::Fn(f) => is_pub(&f.vis),
        Item::Struct(s) => is_pub(&s.vis),
        Item::Enum(e) => is_pub(&e.vis),
        Item::Trait(t) => is_pub(&t.vis),
        Item::Const(c) => is_pub(&c.vis),
        Item::Type(t) => is_pub(&t.vis),
        _ => false,
    }
}

fn public_api() -> anyhow::Result<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files)?;
    let mut modules = BTreeMap::new();
    for file in &files {
        let source = std::fs::read_to_string(file)?;
        let parsed =
            syn::parse_file(&source).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        modules.insert(module_of(&src, file)?, parsed.items);
    }
    let public = public_modules(&modules);
    let names = names(&modules, &public);
    let mut lines = BTreeSet::new();
    for (module, items) in &modules {
        collect(module, items, public.contains(module), &names, &mut lines);
    }
    let mut out = String::new();
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

#[test]
fn the_public_api_matches_its_snapshot() -> anyhow::Result<()> {
    let snapshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/public-api.txt");
    let now = public_api()?;
    if std::env::var_os("DLOCK_BLESS").is_some() {
        std::fs::write(&snapshot, &now)?;
        return Ok(());
    }
    let before = std::fs::read_to_string(&snapshot).unwrap_or_default();
    let old: BTreeSet<&str> = before.lines().collect();
    let new: BTreeSet<&str> = now.lines().collect();
    let mut report = String::new();
    for gone in old.difference(&new) {
        let _ = writeln!(report, "- {gone}");
    }
    for added in new.difference(&old) {
        let _ = writeln!(report, "+ {added}");
    }
    anyhow::ensure!(
        report.is_empty(),
        "the public API changed; if that is intended, run \
         `DLOCK_BLESS=1 cargo test -p dlock-rs --test public_api` and commit tests/public-api.txt:\n{report}"
    );
    Ok(())
}
