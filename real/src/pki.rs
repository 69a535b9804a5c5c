//! The process cluster's certificates: one CA, the serving certificate every component
//! presents on loopback, client certificates (the user is the common name, the group the
//! organization, as the API server reads them) and the service-account signing key.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_public: PathBuf,
}

/// Writes a certificate or key readable by this user only (keys and certificates alike: one
/// rule, no file to get wrong).
fn save(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("write {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// Writes a fresh CA, serving certificate and service-account key under `dir`.
pub fn write(dir: &Path) -> Result<Pki> {
    let _ = fs::remove_dir_all(dir);
    {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "gitops-loop process cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    let ca_cert = save(dir, "ca.crt", &cert.pem())?;
    let issuer = Issuer::new(params, key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![
        "127.0.0.1".to_string(),
        "localhost".into(),
        "10.96.0.1".into(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;
    let serving_cert = save(dir, "serving.crt", &cert.pem())?;
    let serving_key = save(dir, "serving.key", &key.serialize_pem())?;

    let key = KeyPair::generate()?;
    let sa_key = save(dir, "sa.key", &key.serialize_pem())?;
    let sa_public = save(dir, "sa.pub", &key.public_key_pem())?;
    Ok(Pki {
        dir: dir.to_path_buf(),
        issuer,
        ca_cert,
        serving_cert,
        serving_key,
        sa_key,
        sa_public,
    })
}

impl Pki {
    /// A client certificate for `user` (its groups: system:masters for the admin, none else; the
    /// control plane's users are bound by the API server's bootstrap RBAC), signed by the CA.
    /// Returns the certificate and key files.
    pub fn client(&self, user: &str) -> Result<(PathBuf, PathBuf)> {
        let (dir, issuer) = (&self.dir, &self.issuer);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let (common_name, group) = match user {
            "admin" => ("kubernetes-admin", Some("system:masters")),
            "kube-controller-manager" => ("system:kube-controller-manager", None),
            "kube-scheduler" => ("system:kube-scheduler", None),
            // kwok changes Nodes and Pods' status as a kubelet would: an admin on a
            // disposable cluster.
            "kwok" => ("kwok", Some("system:masters")),
            other => (other, None),
        };
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(group) = group {
            params
                .distinguished_name
                .push(DnType::OrganizationName, group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, issuer)?;
        Ok((
            save(dir, &format!("{user}.crt"), &cert.pem())?,
            save(dir, &format!("{user}.key"), &key.serialize_pem())?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keys_and_certificates_are_readable_by_their_owner_only() {
        let dir = std::env::temp_dir().join(format!("real-pki-{}", std::process::id()));
        let pki = write(&dir).expect("the PKI writes");
        let (cert, key) = pki.client("admin").expect("a client certificate");
        for path in [&pki.sa_key, &pki.serving_key, &key, &cert, &pki.ca_cert] {
            let mode = fs::metadata(path).expect("written").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", path.display());
        }
        let mode = fs::metadata(&dir).expect("made").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let _ = fs::remove_dir_all(&dir);
    }
}
