//! TLS on both legs of an MQTT connection: the listener's acceptor and the upstream's
//! connector (a broker at `mqtts://`), built on the STOMP plane's configurations so both
//! sidecars verify certificates the same way.

use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::transport::tls;

/// An acceptor serving the certificate chain in `cert` with the private key in `key`.
pub fn acceptor(cert: &str, key: &str) -> Result<TlsAcceptor, String> {
    Ok(TlsAcceptor::from(tls::server_config(cert, key)?))
}

/// A connector to the broker: its certificate verified against the CAs of `cafile` (a
/// self-signed certificate listed there is trusted as itself), or, `insecure`, not at all.
/// Without `cafile` no CA is trusted: the broker's CA must be given.
pub fn connector(cafile: Option<&str>, insecure: bool) -> Result<TlsConnector, String> {
    if !insecure && cafile.is_none() {
        return Err("an mqtts:// upstream needs its CA file (or insecure)".to_owned());
    }
    Ok(TlsConnector::from(tls::client_config(cafile, insecure)?))
}

/// The name the upstream leg checks the broker's certificate against (and sends as SNI).
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    tls::server_name(host)
}
