//! Options of the file backend and how they are read from a URL.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use super::FILE_SCHEMES;
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

/// Options of the file backend.
///
/// # Examples
///
/// ```
/// use dlock::file::FileConfig;
/// let config = FileConfig::from_url("file:///run/app%20locks?check_interval=250ms").unwrap();
/// assert_eq!(config.dir, std::path::PathBuf::from("/run/app locks"));
/// assert_eq!(config.check_interval, std::time::Duration::from_millis(250));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
#[serde(default)]
pub struct FileConfig {
    /// The folder of the lock files, an absolute path: the lock named `N` is the `flock` on
    /// `dir/N`. Default: empty (a builder or URL must name it).
    pub dir: PathBuf,
    /// How often a holder checks that its lock file is still the one at its path (URL
    /// `check_interval`); a hold also checks at a third of its TTL when that is sooner.
    /// Default: 1 s.
    pub check_interval: Duration,
    /// Create `dir` (and its missing parents) when it does not exist (URL
    /// `create_dirs=true`). Default: false.
    pub create_dirs: bool,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            dir: PathBuf::new(),
            check_interval: Duration::from_secs(1),
            create_dirs: false,
        }
    }
}

impl FileConfig {
    /// Reads `file:///ABSOLUTE/DIR[?option=value&…]`; escapes in the path (`%20`) are decoded
    /// as the `url` crate decodes a file URL. Options: `check_interval` (a duration such as
    /// `250ms`) and `create_dirs` (`true`/`false`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, a host (`file://host/dir`) or a relative path,
    /// a path with a NUL byte, an unknown option or a bad value.
    pub fn from_url(url: &str) -> Result<FileConfig> {
        let parsed = StoreUrl::parse_path(url, FILE_SCHEMES, "file:///ABSOLUTE/DIR")?;
        if parsed.address.is_empty() {
            return Err(parsed.invalid("missing folder: use file:///ABSOLUTE/DIR"));
        }
        let mut config = FileConfig {
            dir: folder(&parsed)?,
            ..FileConfig::default()
        };
        for option in parsed.options() {
            match option.key {
                "check_interval" => config.check_interval = option.duration("250ms or 5s")?,
                "create_dirs" => config.create_dirs = option.flag()?,
                _ => return Err(option.unknown("check_interval, create_dirs")),
            }
        }
        parsed.validated(config, FileConfig::validate)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !self.dir.is_absolute() {
            return Err(Error::invalid_argument(
                "file folder",
                format!("{} is not an absolute path", self.dir.display()),
            ));
        }
        if self.dir.as_os_str().as_bytes().contains(&0) {
            return Err(Error::invalid_argument(
                "file folder",
                "contains a NUL byte",
            ));
        }
        if self.check_interval < Duration::from_millis(10)
            || self.check_interval > Duration::from_secs(3600)
        {
            return Err(Error::invalid_argument(
                "check_interval",
                "must be between 10ms and 1h",
            ));
        }
        Ok(())
    }
}

/// The folder of a `file://` URL, decoded by the `url` crate: a host or a relative path is
/// refused (file locks are this machine's kernel's).
fn folder(parsed: &StoreUrl<'_>) -> Result<PathBuf> {
    // A `#` belongs to the path here; the `url` crate would read it as a fragment.
    let address = parsed.address.replace('#', "%23");
    let file_url = url::Url::parse(&format!("file://{address}"))
        .map_err(|e| parsed.invalid(format!("not a file URL: {e}")))?;
    if let Some(host) = file_url.host_str().filter(|host| !host.is_empty()) {
        return Err(parsed.invalid(format!(
            "a host ({host:?}) or a relative path is not supported: file locks are this \
             machine's; use file:///ABSOLUTE/DIR"
        )));
    }
    let dir = file_url
        .to_file_path()
        .map_err(|()| parsed.invalid("not a folder path: use file:///ABSOLUTE/DIR"))?;
    if dir.as_os_str().as_bytes().contains(&0) {
        return Err(parsed.invalid("a NUL byte (%00) in the folder path"));
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absolute_folder_is_read_and_decoded() {
        let config =
            FileConfig::from_url("file:///var/lock/app%20x/a%23b?create_dirs=true").unwrap();
        assert_eq!(config.dir, PathBuf::from("/var/lock/app x/a#b"));
        assert!(config.create_dirs);
        let config = FileConfig::from_url("FILE://localhost/tmp/locks").unwrap();
        assert_eq!(config.dir, PathBuf::from("/tmp/locks"));
    }

    #[test]
    fn hosts_relative_paths_and_bad_options_are_invalid_urls() {
        crate::backend::url::assert_each_url_refused(
            FileConfig::from_url,
            &[
                "file://",
                "file://relative/dir",
                "file://host.example/dir",
                "file:relative",
                "file:///tmp/a%00b",
                "file:///tmp/locks?check_interval=1ms",
                "file:///tmp/locks?colour=blue",
                "file:///tmp/locks?create_dirs=maybe",
            ],
        );
    }
}
