#!/usr/bin/env bash
# Release check: packages the published crates with `cargo package` (nothing is uploaded),
# checks what each package holds, compiles each package from its own files (`cargo check`, every
# feature on, in a workspace of the unpacked packages), and prints each package's contents and size.
#
#   - the active rustc is at least the declared `rust-version` (the checked minimum);
#   - the licence texts shipped in each crate are the root ones, byte for byte;
#   - nothing ships by accident: no test data, benchmark results or charts, CI or cargo config
#     files, databases or build output;
#   - everything the build reads ships: the manifest, the licences, the README a crate names,
#     its build script, and every `include_str!` / `include_bytes!` target of its sources.
#
# The crates are packaged together, so dlock-cli's dependencies on dlock and dlock-bench
# resolve to the packages made here rather than to crates.io. Uncommitted files are packaged
# as they are (--allow-dirty): the check is about the tree being tested.
set -euo pipefail
cd "$(dirname "$0")/.."

# The published crates, by package name, and the folder of each. The library's package is
# dlock-rs (`dlock` on crates.io is another project's); its import name stays `dlock`.
# dlock-testkit is `publish = false` (this repository's test harness).
crates=(dlock-rs dlock-bench dlock-cli)
declare -A folder=([dlock-rs]=crates/dlock [dlock-bench]=crates/dlock-bench [dlock-cli]=crates/dlock-cli)

fail() {
    echo "package_check: $*" >&2
    exit 1
}

# --- Minimum supported Rust version ------------------------------------------------------
declared="$(sed -n 's/^rust-version = "\([0-9.]*\)"$/\1/p' Cargo.toml)"
[ -n "$declared" ] || fail "no rust-version in [workspace.package] of Cargo.toml"
active="$(rustc --version | awk '{print $2}')"
active="${active%%-*}" # 1.96.0-nightly counts as 1.96.0
oldest="$(printf '%s\n%s\n' "$declared" "$active" | sort -V | head -n 1)"
if [ "$oldest" != "$declared" ]; then
    fail "rustc $active is older than the declared rust-version $declared"
fi
echo "rust-version: declared $declared, checked with rustc $active"

# --- Per crate: manifest facts and licence copies -----------------------------------------
for crate in "${crates[@]}"; do
    manifest="${folder[$crate]}/Cargo.toml"
    grep -q '^rust-version.workspace = true$' "$manifest" ||
        fail "$manifest does not take rust-version from the workspace"
    grep -q '^license.workspace = true$' "$manifest" ||
        fail "$manifest does not take license from the workspace"
    if grep -q '^publish = false' "$manifest"; then fail "$manifest says publish = false"; fi
    for licence in LICENSE-MIT LICENSE-APACHE; do
        cmp -s "$licence" "${folder[$crate]}/$licence" ||
            fail "${folder[$crate]}/$licence is missing or differs from the root $licence"
    done
done

# --- Per crate: the packaged file list ----------------------------------------------------
for crate in "${crates[@]}"; do
    dir="${folder[$crate]}"
    list="$(cargo package -p "$crate" --list --allow-dirty --quiet 2>/dev/null)" ||
        fail "cargo package --list failed for $crate (run it to see why)"

    # Shipped by accident: test data (anything under tests/ but test sources), benchmark
    # results and charts, CI and cargo config, databases, build output, this repository's
    # scripts, and JSON files other than cargo's own record of the commit.
    unwanted="$({
        grep -E -e '^(bench|scripts)/' -e '(^|/)(results|charts|target|\.ci|\.cargo)/' \
            -e '\.(svg|png|jpe?g|db|db-wal|db-shm|db-journal|sqlite|log|crate)$' <<<"$list"
        grep -E '^tests/' <<<"$list" | grep -vE '\.rs$'
        grep -E '\.json$' <<<"$list" | grep -vx '.cargo_vcs_info.json'
    } || true)"
    [ -z "$unwanted" ] || fail "$crate would ship files it must not: $(tr '\n' ' ' <<<"$unwanted")"

    # Needed by the build or by the registry.
    required=(Cargo.toml LICENSE-MIT LICENSE-APACHE)
    grep -q '^readme = ' "$dir/Cargo.toml" && required+=(README.md)
    [ -f "$dir/build.rs" ] && required+=(build.rs)
    # Every file a source includes, as a path relative to the crate.
    while IFS=: read -r source target; do
        [ -n "$source" ] || continue
        resolved="$(realpath -m --relative-to="$dir" "$(dirname "$source")/$target")"
        case "$resolved" in ../*) fail "$source includes $target, outside the crate" ;; esac
        required+=("$resolved")
    done < <(grep -rEo 'include_(str|bytes)!\("[^"]+"\)' "$dir/src" --include='*.rs' |
        sed -E 's/include_(str|bytes)!\("([^"]+)"\)/\2/')
    for file in "${required[@]}"; do
        grep -qxF "$file" <<<"$list" || fail "$crate does not ship $file, which its build needs"
    done
    echo "$crate: file list checked (${#required[@]} required files present, nothing unwanted)"
done

# --- Package, then compile each package from its own files -------------------------------
# `cargo package` without its verify step, which would build (codegen) every dependency again
# under this package set's own feature resolution: ~7 minutes of the test run's two cores. The
# packages are instead unpacked into a workspace of their own and type-checked there with every
# feature on (`cargo check`: build scripts run, every `include_str!` target and module must be
# in the package), against this repository's Cargo.lock and target dir, so the dependencies'
# check artifacts of the lint stage are reused. The later crates' dependencies on the earlier
# ones resolve to the unpacked packages ([patch.crates-io]), not to crates.io.
package_args=()
for crate in "${crates[@]}"; do package_args+=(-p "$crate"); done
cargo package "${package_args[@]}" --no-verify --allow-dirty

target_dir="$(cargo metadata --format-version 1 --no-deps |
    grep -o '"target_directory":"[^"]*"' | sed 's/.*:"\(.*\)"/\1/')"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
unpacked="$target_dir/package/unpacked"
rm -rf "$unpacked"
mkdir -p "$unpacked"
members=()
patches=()
for crate in "${crates[@]}"; do
    file="$target_dir/package/$crate-$version.crate"
    [ -f "$file" ] || fail "no package at $file"
    tar -xzf "$file" -C "$unpacked"
    members+=("\"$crate-$version\"")
    patches+=("$crate = { path = \"$crate-$version\" }")
done
{
    echo "[workspace]"
    echo "resolver = \"2\""
    echo "members = [$(IFS=,; echo "${members[*]}")]"
    echo "[patch.crates-io]"
    printf '%s\n' "${patches[@]}"
} >"$unpacked/Cargo.toml"
cp Cargo.lock "$unpacked/Cargo.lock"
# From the repository root's config (.cargo/config.toml gives etcd's build its protoc).
(cd "$unpacked" && CARGO_TARGET_DIR="$target_dir" cargo check --workspace --all-features)
echo "packages checked from their own files: ${crates[*]}"

# --- What ships --------------------------------------------------------------------------
for crate in "${crates[@]}"; do
    file="$target_dir/package/$crate-$version.crate"
    [ -f "$file" ] || fail "no package at $file"
    echo
    echo "== $crate $version: $(tar -tzf "$file" | wc -l) files, $(stat -c %s "$file") bytes compressed, $(
        tar -tzvf "$file" | awk '{s += $3} END {print s}') bytes unpacked"
    # size and path, the crate's own folder prefix left out
    tar -tzvf "$file" | awk -v prefix="$crate-$version/" '{sub(prefix, "", $6); printf "%9d  %s\n", $3, $6}'
done
