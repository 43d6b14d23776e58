//! TLS for HTTPS readiness probes, as the kubelet does them: the pod's certificate is not
//! checked (it is usually self-signed or names a Service, not the pod IP), but the handshake
//! is — the server must hold the key of the certificate it presents.

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// One client configuration for every probe (ring, as the rest of the process uses).
static CONNECTOR: LazyLock<Result<TlsConnector, rustls::Error>> = LazyLock::new(|| {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = AnyCertificate {
        algorithms: provider.signature_verification_algorithms,
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
});

/// A TLS session over `tcp` to the pod at `ip` (named by its IP, as the kubelet's probe does).
pub(super) async fn connect(tcp: TcpStream, ip: IpAddr) -> std::io::Result<TlsStream<TcpStream>> {
    let connector = CONNECTOR
        .as_ref()
        .map_err(|e| std::io::Error::other(e.clone()))?;
    connector
        .connect(ServerName::IpAddress(ip.into()), tcp)
        .await
}

/// Takes any certificate, and checks the handshake's signatures with its key.
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
