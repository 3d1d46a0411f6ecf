//! TLS flags (docs/operations.md, "TLS"): the server's certificate, and the
//! CA every command that connects to a server trusts.

use std::path::PathBuf;

use clap::Args;
use corefarm_server::tls::{ServerTls, TlsPorts};
use corefarm_smp::tls::ClientTls;

/// `corefarm server`: TLS on its ports.
#[derive(Args, Clone, Debug)]
pub struct ServerTlsArgs {
    /// PEM certificate chain of the server (its own certificate first):
    /// turns TLS on for the ports --tls-ports names.
    #[arg(long, requires = "tls_key", value_name = "PEM", help_heading = "TLS")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", value_name = "PEM", help_heading = "TLS")]
    pub tls_key: Option<PathBuf>,
    /// Which ports speak TLS: users, nodes or both.
    #[arg(
        long,
        default_value = "both",
        requires = "tls_cert",
        help_heading = "TLS"
    )]
    pub tls_ports: TlsPorts,
}

impl ServerTlsArgs {
    pub fn load(&self) -> anyhow::Result<Option<ServerTls>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Ok(Some(
                ServerTls::load(c, k, self.tls_ports).map_err(anyhow::Error::msg)?,
            )),
            _ => Ok(None),
        }
    }
}

/// Any command that connects to a server: TLS to it.
#[derive(Args, Clone, Debug, Default)]
pub struct ClientTlsArgs {
    /// PEM file of the CA(s) that signed the server's certificate: connect
    /// with TLS (the server's port must have it on).
    #[arg(long, value_name = "PEM", help_heading = "TLS")]
    pub tls_ca: Option<PathBuf>,
    /// Name the server's certificate must carry. Default: the host part of
    /// the server address.
    #[arg(long, requires = "tls_ca", value_name = "NAME", help_heading = "TLS")]
    pub tls_server_name: Option<String>,
}

impl ClientTlsArgs {
    pub fn load(&self) -> anyhow::Result<Option<ClientTls>> {
        self.tls_ca
            .as_deref()
            .map(|ca| ClientTls::from_ca_file(ca, self.tls_server_name.as_deref()))
            .transpose()
            .map_err(anyhow::Error::msg)
    }
}
