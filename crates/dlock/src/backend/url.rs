//! One reader for every store URL:
//! `SCHEME://[user[:password]@]host[:port][,host[:port]…][/path][?key=value&…][#fragment]`.
//!
//! Hosts are checked by the `url` crate and escapes decoded by `percent-encoding`; each
//! backend's `config.rs` keeps only its own options. Every error names the URL redacted, and
//! no reason quotes a credential.
// Shared by every backend, each using part of it: a build without some backends leaves
// parts unused (the full build, which CI lints, uses all of it).
#![cfg_attr(not(dlock_all_backends), allow(dead_code, unused_imports))]

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result, redact_url};

/// A store URL split into its parts, borrowed from the text the user gave.
#[derive(Clone, Debug)]
pub(crate) struct StoreUrl<'a> {
    url: &'a str,
    /// The scheme, lower-cased.
    pub(crate) scheme: String,
    /// Everything between `://` and the query or fragment.
    pub(crate) address: &'a str,
    /// The raw query, without `?` (empty when there is none).
    pub(crate) query: &'a str,
    /// The raw fragment, without `#`.
    pub(crate) fragment: Option<&'a str>,
}

/// One `host[:port]` of a URL, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The host as written (an IPv6 address keeps its brackets).
    pub(crate) host: String,
    pub(crate) port: Option<u16>,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

impl Endpoint {
    /// `host:port`, with `default_port` when the URL gave none.
    pub(crate) fn with_port(&self, default_port: u16) -> String {
        format!("{}:{}", self.host, self.port.unwrap_or(default_port))
    }
}

/// One `key=value` of a URL's query.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UrlOption<'u, 'a> {
    url: &'u StoreUrl<'a>,
    pub(crate) key: &'a str,
    /// The value as written (still %-escaped).
    pub(crate) raw: &'a str,
    /// `key=value` as written, for options handed on to a driver.
    pub(crate) pair: &'a str,
}

impl<'a> StoreUrl<'a> {
    /// Splits `url`, whose scheme must be one of `schemes` (any case); `form` shows the
    /// expected shape in the error, e.g. `etcd://host:port[,host:port…]`.
    pub(crate) fn parse(url: &'a str, schemes: &[&str], form: &str) -> Result<StoreUrl<'a>> {
        StoreUrl::split(url, schemes, form, true)
    }

    /// Like [`parse`](StoreUrl::parse) for a URL whose address is a file path: a `#` belongs
    /// to the path, so there is no fragment.
    pub(crate) fn parse_path(url: &'a str, schemes: &[&str], form: &str) -> Result<StoreUrl<'a>> {
        StoreUrl::split(url, schemes, form, false)
    }

    fn split(url: &'a str, schemes: &[&str], form: &str, fragments: bool) -> Result<StoreUrl<'a>> {
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact_url(url),
            reason,
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid(format!("expected {form}")))?;
        let scheme = scheme.to_ascii_lowercase();
        if !schemes.contains(&scheme.as_str()) {
            let expected: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
            return Err(invalid(format!("expected {}", expected.join(" or "))));
        }
        if rest.contains('\0') {
            return Err(invalid("a NUL byte in the URL".into()));
        }
        let (rest, fragment) = match rest.split_once('#').filter(|_| fragments) {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (rest, None),
        };
        let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
        Ok(StoreUrl {
            url,
            scheme,
            address,
            query,
            fragment,
        })
    }

    /// An [`Error::InvalidUrl`] for this URL (redacted) with `reason`.
    pub(crate) fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidUrl {
            url: redact_url(self.url),
            reason: reason.into(),
        }
    }

    /// Maps a config check's error (an invalid argument) to an invalid-URL error.
    pub(crate) fn checked(&self, result: Result<()>) -> Result<()> {
        result.map_err(|error| self.invalid(error.to_string()))
    }

    /// `config`, read from this URL, once it passes `validate`: the check a config built in
    /// code passes too. A failure is an invalid-URL error.
    pub(crate) fn validated<C>(&self, config: C, validate: fn(&C) -> Result<()>) -> Result<C> {
        self.checked(validate(&config)).map(|()| config)
    }

    /// The authority: the address up to its first `/`.
    pub(crate) fn authority(&self) -> &'a str {
        self.address
            .find('/')
            .map_or(self.address, |at| &self.address[..at])
    }

    /// The path: the address from its first `/` on (empty when there is none).
    pub(crate) fn path(&self) -> &'a str {
        self.address.find('/').map_or("", |at| &self.address[at..])
    }

    /// The userinfo as written: the authority before its last `@`.
    pub(crate) fn userinfo(&self) -> Option<&'a str> {
        self.authority()
            .rsplit_once('@')
            .map(|(userinfo, _)| userinfo)
    }

    /// The user name and password, %-decoded. An empty user name is refused.
    pub(crate) fn credentials(&self) -> Result<Option<(String, Option<String>)>> {
        let Some(userinfo) = self.userinfo() else {
            return Ok(None);
        };
        let (user, password) = match userinfo.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (userinfo, None),
        };
        if user.is_empty() {
            return Err(self.invalid("empty user name before '@'"));
        }
        let user = self.decode("the user name", user)?;
        let password = password
            .map(|password| self.decode("the password", password))
            .transpose()?;
        Ok(Some((user, password)))
    }

    /// Each `host[:port]` of the authority, as written (comma-separated for a cluster).
    pub(crate) fn hosts(&self) -> Vec<&'a str> {
        let authority = self.authority();
        let hosts = authority
            .rsplit_once('@')
            .map_or(authority, |(_, hosts)| hosts);
        hosts.split(',').collect()
    }

    /// Checks each host of the authority (`port_required`: refuse a host without a port).
    pub(crate) fn endpoints(&self, port_required: bool) -> Result<Vec<Endpoint>> {
        self.hosts()
            .into_iter()
            .map(|host| self.endpoint(host, port_required))
            .collect()
    }

    /// Checks one `host[:port]` or `[v6]:port`: the host by the `url` crate's rules, the port
    /// a number from 1 to 65535.
    pub(crate) fn endpoint(&self, text: &str, port_required: bool) -> Result<Endpoint> {
        let (host, port) = match text.strip_prefix('[') {
            Some(v6) => match v6.split_once(']') {
                Some((inside, after)) => (&text[..inside.len() + 2], after.strip_prefix(':')),
                None => return Err(self.invalid(format!("{text:?}: bad IPv6 brackets"))),
            },
            None => match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            },
        };
        if host.is_empty() {
            return Err(self.invalid(format!("missing host in {text:?}")));
        }
        // The host stays as written; the `url` crate only judges it (IPv4, IPv6 in brackets,
        // or a domain without spaces, `@`, `%`, `?`, `#` or brackets).
        if host.contains(['%', '[', ']']) && !host.starts_with('[')
            || url::Host::parse(host).is_err()
        {
            return Err(self.invalid(format!("bad host in {text:?}")));
        }
        let port = match port {
            None if port_required => {
                return Err(self.invalid(format!("{text:?} has no port (host:PORT)")));
            }
            None => None,
            Some(port) => match port.parse::<u16>() {
                Ok(port) if port > 0 => Some(port),
                _ => {
                    return Err(self.invalid(format!(
                        "{text:?}: port {port:?} is not a number from 1 to 65535"
                    )));
                }
            },
        };
        Ok(Endpoint {
            host: host.to_owned(),
            port,
        })
    }

    /// The query's options, in order (empty pairs skipped).
    pub(crate) fn options(&self) -> impl Iterator<Item = UrlOption<'_, 'a>> {
        self.query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
                UrlOption {
                    url: self,
                    key,
                    raw,
                    pair,
                }
            })
    }

    /// `raw` with its `%XX` escapes decoded; `what` names it in an error (never its value, which
    /// may be a password).
    pub(crate) fn decode(&self, what: &str, raw: &str) -> Result<String> {
        let bytes = raw.as_bytes();
        let well_formed = bytes.iter().enumerate().all(|(at, byte)| {
            *byte != b'%'
                || bytes
                    .get(at + 1..at + 3)
                    .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
        });
        if !well_formed {
            return Err(self.invalid(format!("{what}: a bad %-escape")));
        }
        percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map(Cow::into_owned)
            .map_err(|_| self.invalid(format!("{what} is not UTF-8 once %-decoded")))
    }
}

impl UrlOption<'_, '_> {
    /// The value, %-decoded.
    pub(crate) fn text(&self) -> Result<String> {
        self.url.decode(&format!("option {}", self.key), self.raw)
    }

    /// A duration such as `250ms` or `2s`; `example` is shown when it is not one.
    pub(crate) fn duration(&self, example: &str) -> Result<Duration> {
        humantime::parse_duration(self.raw).map_err(|error| {
            self.url.invalid(format!(
                "option {}={:?}: {error} (try {example})",
                self.key, self.raw
            ))
        })
    }

    /// `true`/`1`/empty or `false`/`0`.
    pub(crate) fn flag(&self) -> Result<bool> {
        match self.raw {
            "true" | "1" | "" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(self.url.invalid(format!(
                "option {}={:?}: expected true or false",
                self.key, self.raw
            ))),
        }
    }

    /// A number.
    pub(crate) fn number<T: FromStr>(&self) -> Result<T> {
        self.raw.parse().map_err(|_| {
            self.url.invalid(format!(
                "option {}={:?}: expected a number",
                self.key, self.raw
            ))
        })
    }

    /// One of `choices`, by name.
    pub(crate) fn choice<T: Copy>(&self, choices: &[(&str, T)]) -> Result<T> {
        choices
            .iter()
            .find(|(name, _)| *name == self.raw)
            .map(|(_, value)| *value)
            .ok_or_else(|| {
                let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
                self.url.invalid(format!(
                    "option {}={:?}: expected {}",
                    self.key,
                    self.raw,
                    names.join(" or ")
                ))
            })
    }

    /// The error for an option this backend does not know; `known` lists those it does.
    pub(crate) fn unknown(&self, known: &str) -> Error {
        self.url
            .invalid(format!("unknown option {:?} (known: {known})", self.key))
    }
}

/// Asserts that `parse` refuses each of `urls` with [`Error::InvalidUrl`] (the configs' tests).
#[cfg(test)]
pub(crate) fn assert_each_url_refused<T: std::fmt::Debug>(
    parse: impl Fn(&str) -> Result<T>,
    urls: &[&str],
) {
    for url in urls {
        let result = parse(url);
        assert!(
            matches!(result, Err(Error::InvalidUrl { .. })),
            "{url}: {result:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> StoreUrl<'_> {
        StoreUrl::parse(url, &["x", "xs"], "x://host").unwrap()
    }

    #[test]
    fn splits_every_part() {
        let url = parse("XS://u%40x:p%3Aw@a:1,[::1]:2,b/some/path?k=v%2F&flag#frag");
        assert_eq!(url.scheme, "xs");
        assert_eq!(url.authority(), "u%40x:p%3Aw@a:1,[::1]:2,b");
        assert_eq!(url.path(), "/some/path");
        assert_eq!(url.fragment, Some("frag"));
        assert_eq!(
            url.credentials().unwrap(),
            Some(("u@x".into(), Some("p:w".into())))
        );
        let endpoints = url.endpoints(false).unwrap();
        assert_eq!(endpoints[1].host, "[::1]");
        assert_eq!(endpoints[1].port, Some(2));
        assert_eq!(endpoints[2].with_port(7), "b:7");
        let options: Vec<_> = url.options().collect();
        assert_eq!(options[0].text().unwrap(), "v/");
        assert!(options[1].flag().unwrap());
    }

    #[test]
    fn refuses_bad_parts_without_quoting_secrets() {
        assert!(StoreUrl::parse("y://h", &["x"], "x://host").is_err());
        assert!(StoreUrl::parse("no scheme", &["x"], "x://host").is_err());
        for (url, port_required) in [
            ("x://:1", false),
            ("x://h", true),
            ("x://h:0", false),
            ("x://h:99999", false),
            ("x://h:x", false),
            ("x://[::1:1", false),
            ("x://a b:1", false),
            ("x://h%41:1", false),
            ("x://a,,b", false),
        ] {
            assert!(parse(url).endpoints(port_required).is_err(), "{url}");
        }
        let url = parse("x://u:s3cret%zz@h");
        let error = url.credentials().unwrap_err().to_string();
        assert!(
            error.contains("bad %-escape") && !error.contains("s3cret"),
            "{error}"
        );
        assert!(parse("x://@h").credentials().is_err());
        let soon = parse("x://h?t=soon");
        let option = soon.options().next().unwrap();
        assert!(option.duration("2s").is_err());
        assert!(option.number::<u32>().is_err());
        assert!(option.choice(&[("a", 1)]).is_err());
    }
}
