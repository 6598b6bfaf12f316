//! rustls configurations: the client leg's server side, the upstream leg's client side.

use std::fs::File;
use std::io::BufReader;
use std::sync::Arc;

use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    self, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme,
};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn read_certs(path: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = File::open(path).map_err(|e| format!("{what} {path}: {e}"))?;
    let certs = rustls_pemfile::certs(&mut BufReader::new(file))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} {path}: no PEM certificate in it"));
    }
    Ok(certs)
}

/// The server side of TLS on the client leg: a certificate chain and its key (PEM files).
pub fn server_config(cert: &str, key: &str) -> Result<Arc<ServerConfig>, String> {
    let certs = read_certs(cert, "TLS certificate")?;
    let file = File::open(key).map_err(|e| format!("TLS key {key}: {e}"))?;
    let key_der: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut BufReader::new(file))
        .map_err(|e| format!("TLS key {key}: {e}"))?
        .ok_or_else(|| format!("TLS key {key}: no PEM private key in it"))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| format!("TLS certificate {cert} / key {key}: {e}"))?;
    Ok(Arc::new(config))
}

/// The client side of TLS on the upstream leg: trust the CAs of `cafile`, or nothing
/// at all when `insecure` (a test broker's self-signed certificate).
pub fn client_config(cafile: Option<&str>, insecure: bool) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
            .with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        let mut pinned = Vec::new();
        if let Some(path) = cafile {
            for cert in read_certs(path, "CA file")? {
                // One webpki cannot take as a root may still be the broker's own.
                let _ = roots.add(cert.clone());
                pinned.push(cert);
            }
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| format!("CA file: {e}"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(TrustedOrPinned { webpki, pinned }))
            .with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// The name the upstream leg checks the broker's certificate against (and sends as SNI).
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_owned()).map_err(|e| format!("TLS server name {host:?}: {e}"))
}

/// The usual chain verification, and one case OpenSSL (the Python plane) accepts and
/// webpki does not: the broker presents a self-signed certificate that the CA file holds
/// itself, made as a CA (what `openssl req -x509` makes by default). That exact
/// certificate is trusted, for the names it was issued for.
#[derive(Debug)]
struct TrustedOrPinned {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for TrustedOrPinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let refused = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(error) => error,
        };
        if !self
            .pinned
            .iter()
            .any(|cert| cert.as_ref() == end_entity.as_ref())
        {
            return Err(refused);
        }
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| refused.clone())?;
        cert.verify_is_valid_for_subject_name(server_name)
            .map_err(|_| refused)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// `--upstream-insecure`: every certificate passes; signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
