//! TLS on both legs: the listener's configuration, and the upstream connection's (a broker
//! at `mqtts://`), from PEM files.

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
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn read_certs(path: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = File::open(path).map_err(|e| format!("{what} {path}: {e}"))?;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut BufReader::new(file))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} {path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} {path}: no PEM certificate in it"));
    }
    Ok(certs)
}

/// An acceptor serving the certificate chain in `cert` with the private key in `key`.
pub fn acceptor(cert: &str, key: &str) -> Result<TlsAcceptor, String> {
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
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A connector to the broker: its certificate verified against the CAs of `cafile` (a
/// self-signed certificate listed there is trusted as itself), or, `insecure`, not at all.
/// Without `cafile` no CA is trusted: the broker's CA must be given.
pub fn connector(cafile: Option<&str>, insecure: bool) -> Result<TlsConnector, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
            .with_no_client_auth()
    } else {
        let path = cafile.ok_or("an mqtts:// upstream needs its CA file (or insecure)")?;
        let pinned = read_certs(path, "CA file")?;
        let mut roots = RootCertStore::empty();
        for cert in &pinned {
            let _ = roots.add(cert.clone());
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| format!("CA file {path}: {e}"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(TrustedOrPinned { webpki, pinned }))
            .with_no_client_auth()
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_owned()).map_err(|e| format!("TLS server name {host:?}: {e}"))
}

/// WebPKI verification, and for a certificate listed in the CA file itself (a self-signed
/// broker certificate, which WebPKI refuses as its own issuer) the name check alone.
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

/// Insecure: every certificate passes; signatures are still checked.
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
