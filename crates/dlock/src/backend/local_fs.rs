//! Whether a folder is on one machine's own filesystem. A store kept in files (SQLite's
//! database, the file backend's lock files) counts on this kernel's locks and clock; on a
//! network or shared filesystem another kernel's processes take locks of their own, so both
//! backends refuse such a folder with this one check.

use std::path::Path;

/// `statfs` magic numbers of filesystems another machine can write (linux/magic.h and the
/// filesystems' own sources), with the name shown in the error.
const SHARED_FILESYSTEMS: &[(i64, &str)] = &[
    (0x6969, "nfs"),
    (0x517b, "smb"),
    (0xff53_4d42, "cifs"),
    (0xfe53_4d42, "smb2"),
    (0x0102_1997, "9p"),
    (0x00c3_6400, "ceph"),
    (0x5346_414f, "afs"),
    (0x6b41_4653, "kafs"),
    (0x7375_7245, "coda"),
    (
        0x6573_5546,
        "fuse (sshfs, virtiofs and other shared folders)",
    ),
    (0x7461_636f, "ocfs2"),
    (0x0116_1970, "gfs2"),
    (0x0bd0_0bd0, "lustre"),
    (0x564c, "ncp"),
    (0x786f_4256, "vboxsf"),
];

/// The name of the shared filesystem whose `statfs` type is `magic`, if it is one.
fn shared_filesystem(magic: i64) -> Option<&'static str> {
    SHARED_FILESYSTEMS
        .iter()
        .find(|(known, _)| *known == magic)
        .map(|(_, name)| *name)
}

/// The shared filesystem `dir` is on (its name for the error), or `None` for a local one.
///
/// # Errors
///
/// `statfs` failing (the folder missing or unreadable).
pub(crate) fn shared_filesystem_at(dir: &Path) -> std::io::Result<Option<&'static str>> {
    let stat = nix::sys::statfs::statfs(dir)?;
    // The type's width differs between targets; the magic numbers fit in 32 bits.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let magic = stat.filesystem_type().0 as i64;
    Ok(shared_filesystem(magic))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_shared_filesystems_are_known_and_local_ones_are_not() {
        for (magic, name) in [
            (0x6969, "nfs"),
            (0xff53_4d42, "cifs"),
            (0x0102_1997, "9p"),
            (0x6573_5546, "fuse"),
        ] {
            assert!(
                shared_filesystem(magic).is_some_and(|shown| shown.starts_with(name)),
                "{magic:#x}"
            );
        }
        // ext4, tmpfs, btrfs, xfs, overlayfs: one machine's.
        for magic in [0xef53, 0x0102_1994, 0x9123_683e, 0x5846_5342, 0x794c_7630] {
            assert_eq!(shared_filesystem(magic), None, "{magic:#x}");
        }
    }

    #[test]
    fn a_local_folder_is_not_shared() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(shared_filesystem_at(dir.path()).unwrap(), None);
    }
}
