//! TLS settings shared by every corefarm peer: the server's
//! certificate and key (`--tls-cert`, `--tls-key`), the CA a node or user
//! trusts (`--tls-ca`) and the name it expects (`--tls-server-name`), and
//! the words a failed handshake is explained with.
//!
//! The byte streams themselves live with each peer (tokio-rustls in the
//! server and the node manager, a split rustls connection in the blocking
//! client); this module only builds the rustls configurations, with the
//! `ring` provider, so nothing depends on a process-wide default.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls;
pub use rustls_pki_types as pki;

use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, InvalidDnsNameError, PrivateKeyDer, ServerName};

/// Why TLS settings could not be made: the files given, or the names. The
/// text names the file or option to fix; it is what a command-line user reads.
// Causes are in the messages and not `source`s: error chains would print
// them twice.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificates from {}: {cause}", path.display())]
    Certificates { path: PathBuf, cause: pem::Error },
    #[error("no PEM certificate in {}", path.display())]
    NoCertificate { path: PathBuf },
    #[error("cannot read a private key from {}: {cause}", path.display())]
    Key { path: PathBuf, cause: pem::Error },
    #[error(
        "{} and {} do not make a usable certificate: {cause}",
        cert.display(),
        key.display()
    )]
    Unusable {
        cert: PathBuf,
        key: PathBuf,
        cause: rustls::Error,
    },
    #[error("no usable CA certificate in {}", path.display())]
    NoCa { path: PathBuf },
    /// The crypto provider refused the protocol versions (not expected with `ring`).
    #[error("{0}")]
    Provider(rustls::Error),
    #[error("bad --tls-server-name {name:?}: {cause}")]
    ServerName {
        name: String,
        cause: InvalidDnsNameError,
    },
    #[error("{host:?} is not a name a certificate can carry ({cause}); give --tls-server-name")]
    HostName {
        host: String,
        cause: InvalidDnsNameError,
    },
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of a PEM file (a chain: the server's first).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|cause| TlsError::Certificates {
            path: path.to_path_buf(),
            cause,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|cause| TlsError::Key {
        path: path.to_path_buf(),
        cause,
    })
}

/// The server's configuration from `--tls-cert` and `--tls-key`.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let (certs, key_der) = (load_certs(cert)?, load_key(key)?);
    let cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Provider)?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|cause| TlsError::Unusable {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            cause,
        })?;
    Ok(Arc::new(cfg))
}

/// What a node or a user needs to open TLS connections to a server.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    /// `--tls-server-name`; else the host part of the address connected to.
    name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the certificates of the PEM file `ca` (`--tls-ca`).
    pub fn from_ca_file(ca: &Path, server_name: Option<&str>) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(load_certs(ca)?);
        if added == 0 {
            return Err(TlsError::NoCa {
                path: ca.to_path_buf(),
            });
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Provider)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = server_name
            .map(|n| {
                ServerName::try_from(n.to_string()).map_err(|cause| TlsError::ServerName {
                    name: n.to_string(),
                    cause,
                })
            })
            .transpose()?;
        Ok(ClientTls {
            config: Arc::new(config),
            name,
        })
    }

    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// The name the server's certificate must carry when connecting to
    /// `addr` (`host:port`): the configured one, or `host`.
    pub fn server_name(&self, addr: &str) -> Result<ServerName<'static>, TlsError> {
        if let Some(n) = &self.name {
            return Ok(n.clone());
        }
        let host = match addr.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => h,
            _ => addr,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).map_err(|cause| TlsError::HostName {
            host: host.to_string(),
            cause,
        })
    }
}

/// Why a TLS handshake failed, in terms of what to fix.
pub fn explain(e: &io::Error) -> String {
    let rustls_err = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match rustls_err {
        Some(rustls::Error::InvalidCertificate(c)) => {
            match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    format!("the server's certificate is not signed by a CA in --tls-ca ({c:?})")
                }
                CertificateError::NotValidForNameContext {
                    expected,
                    presented,
                } => {
                    format!(
                "the server's certificate is not valid for the name connected to, {:?}: it is \
                 for {} (give --tls-server-name with one of those)",
                expected.to_str(),
                match presented.as_slice() {
                    [] => "no name".to_string(),
                    names => names.iter().map(|n| plain_name(n)).collect::<Vec<_>>().join(", "),
                }
            )
                }
                CertificateError::NotValidForName => {
                    "the server's certificate is not valid for the \
                 name connected to (give --tls-server-name with a name the certificate carries)"
                        .into()
                }
                other => format!("the server's certificate was refused: {other:?}"),
            }
        }
        Some(rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }) => {
            "the server did not answer in TLS (is its port plain TCP? then connect without \
             --tls-ca)"
                .into()
        }
        Some(rustls::Error::AlertReceived(a)) => {
            format!("the server refused the TLS handshake (alert {a:?})")
        }
        Some(other) => other.to_string(),
        None if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ) =>
        {
            "the server closed the connection during the TLS handshake (is its port plain TCP? \
             then connect without --tls-ca)"
                .into()
        }
        None => e.to_string(),
    }
}

/// A certificate's name as the verifier reports it (`DnsName("farm")`,
/// `IpAddress(10.0.0.1)`) without the wrapper.
fn plain_name(n: &str) -> &str {
    ["DnsName(\"", "IpAddress(", "UniformResourceIdentifier(\""]
        .iter()
        .find_map(|p| n.strip_prefix(p))
        .map_or(n, |rest| rest.trim_end_matches(')').trim_end_matches('"'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wrong name is told in words: the name connected to and the names
    /// the certificate carries, never the library's debug text.
    #[test]
    fn a_certificate_for_another_name_is_explained_in_words() {
        let c = CertificateError::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("farm.example").unwrap(),
            presented: vec![
                "DnsName(\"localhost\")".into(),
                "IpAddress(127.0.0.1)".into(),
            ],
        };
        let e = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(c),
        );
        let text = explain(&e);
        assert!(text.contains("\"farm.example\""), "{text}");
        assert!(
            text.contains("127.0.0.1") && text.contains("--tls-server-name"),
            "{text}"
        );
        assert!(!text.contains("NotValidForNameContext"), "{text}");
    }

    #[test]
    fn the_server_name_is_the_host_of_the_address_unless_given() {
        let ca = std::env::temp_dir().join(format!("corefarm-tls-ca-{}.pem", std::process::id()));
        std::fs::write(&ca, "not a certificate").unwrap();
        let e = ClientTls::from_ca_file(&ca, None).unwrap_err();
        assert!(
            matches!(&e, TlsError::NoCertificate { path } if *path == ca),
            "{e:?}"
        );
        let _ = std::fs::remove_file(&ca);

        let t = ClientTls {
            config: Arc::new(
                ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(RootCertStore::empty())
                    .with_no_client_auth(),
            ),
            name: None,
        };
        let ip = |s: &str| t.server_name(s).unwrap().to_str().into_owned();
        assert_eq!(ip("127.0.0.1:7000"), "127.0.0.1");
        assert_eq!(ip("[::1]:7000"), "::1");
        assert_eq!(ip("farm.example:7000"), "farm.example");
        assert!(matches!(
            t.server_name("bad name:1"),
            Err(TlsError::HostName { host, .. }) if host == "bad name"
        ));
    }
}
