//! TLS toward clients: the listener's rustls configuration from PEM files.

use std::fs::File;
use std::io::BufReader;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// An acceptor serving the certificate chain in `cert` with the private key in `key`.
pub fn acceptor(cert: &str, key: &str) -> Result<TlsAcceptor, String> {
    let file = File::open(cert).map_err(|e| format!("TLS certificate {cert}: {e}"))?;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut BufReader::new(file))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("TLS certificate {cert}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("TLS certificate {cert}: no PEM certificate in it"));
    }
    let file = File::open(key).map_err(|e| format!("TLS key {key}: {e}"))?;
    let key_der: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut BufReader::new(file))
        .map_err(|e| format!("TLS key {key}: {e}"))?
        .ok_or_else(|| format!("TLS key {key}: no PEM private key in it"))?;
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| format!("TLS certificate {cert} / key {key}: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
