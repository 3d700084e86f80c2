//! Certificates for TLS tests: a throwaway CA and a server certificate it signed, for
//! `127.0.0.1` and `localhost`, written as PEM files into a temp dir.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// PEM files of a test CA and of a server certificate it signed.
#[derive(Debug)]
pub struct TestCertificates {
    dir: tempfile::TempDir,
}

impl TestCertificates {
    /// Generates a CA and a server certificate for `127.0.0.1` and `localhost`.
    ///
    /// # Errors
    ///
    /// Key generation or file writes failed.
    ///
    /// # Examples
    ///
    /// ```
    /// let certs = dlock_testkit::tls::TestCertificates::generate()?;
    /// assert!(certs.ca().is_file());
    /// # Ok::<(), anyhow::Error>(())
    /// ```
    pub fn generate() -> anyhow::Result<TestCertificates> {
        let dir = tempfile::Builder::new().prefix("dlock-tls-").tempdir()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "dlock test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        server_params
            .distinguished_name
            .push(DnType::CommonName, "dlock test server");
        let server_key = KeyPair::generate()?;
        let server = server_params.signed_by(&server_key, &ca)?;
        write(dir.path(), "ca.pem", &ca.pem())?;
        write(dir.path(), "server.pem", &server.pem())?;
        write(dir.path(), "server.key", &server_key.serialize_pem())?;
        Ok(TestCertificates { dir })
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM).
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server's private key (PEM).
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> anyhow::Result<()> {
    std::fs::write(dir.join(name), pem).with_context(|| format!("write {name}"))
}
