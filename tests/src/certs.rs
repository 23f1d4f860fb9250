//! Certificates the TLS tests make: a CA of their own and a server certificate it signed for
//! `127.0.0.1` and `localhost`, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// The files of one CA and the server certificate it signed.
#[derive(Debug, Clone)]
pub struct Certs {
    /// The CA's certificate (what a client trusts).
    pub ca: PathBuf,
    /// The server's certificate chain (its certificate, then the CA's).
    pub cert: PathBuf,
    /// The server's private key (PKCS#8).
    pub key: PathBuf,
}

/// Makes a new CA named `name` and a server certificate it signs, into `dir` as
/// `NAME-ca.pem`, `NAME-cert.pem` and `NAME-key.pem`.
pub fn make(dir: &Path, name: &str) -> Certs {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} test CA"));
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("a CA key"))
        .expect("the CA");
    let server_key = KeyPair::generate().expect("a server key");
    let server_params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("server parameters");
    let server = server_params
        .signed_by(&server_key, &ca)
        .expect("the server certificate");
    let certs = Certs {
        ca: dir.join(format!("{name}-ca.pem")),
        cert: dir.join(format!("{name}-cert.pem")),
        key: dir.join(format!("{name}-key.pem")),
    };
    std::fs::write(&certs.ca, ca.pem()).expect("write the CA");
    std::fs::write(&certs.cert, server.pem() + &ca.pem()).expect("write the chain");
    std::fs::write(&certs.key, server_key.serialize_pem()).expect("write the key");
    certs
}
