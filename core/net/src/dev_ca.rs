//! The development certificate authority: a per-machine CA that lets a broker
//! and its clients speak verified TLS with zero configuration.
//!
//! Files (PEM), in the Rill home directory ([`rill_home`], `$RILL_HOME` or
//! `~/.rill`):
//!
//! ```text
//! ca.pem       the CA certificate (self-signed, ECDSA P-256); clients trust it
//! ca-key.pem   its PKCS#8 private key, mode 0600
//! ca.lock      an empty file; an exclusive lock on it serialises creation
//! ```
//!
//! Invariants:
//! - `ca.pem` and `ca-key.pem` only ever appear complete: each is written to a temp
//!   file, fsynced, renamed into place, then the directory is fsynced. The key is
//!   published before the certificate, so whoever sees `ca.pem` also finds the key.
//! - Creation is serialised by an advisory lock on `ca.lock` (released by the OS if
//!   the holder dies), so two brokers starting at once end up with one CA. The wait
//!   for the lock is bounded by [`DEV_CA_LOCK_WAIT`].
//! - A loaded key is checked to belong to the loaded certificate.
//! - Broker certificates are issued on demand (cheap) and never written here.
//!
//! The CA's subject is [`DEV_CA_COMMON_NAME`] plus a fingerprint of its public key
//! (FNV-1a, 64 bits, hex): deterministic, so the CA is rebuilt from its key alone
//! on load (issued certificates name that subject as their issuer), and distinct
//! per CA, so a certificate from another machine's CA fails as "unknown issuer".

use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::NetError;

/// File name of the development CA certificate inside the Rill home.
pub const DEV_CA_CERT_FILE: &str = "ca.pem";
/// File name of the development CA private key inside the Rill home.
pub const DEV_CA_KEY_FILE: &str = "ca-key.pem";
/// File name of the lock that serialises creation of the development CA.
pub const DEV_CA_LOCK_FILE: &str = "ca.lock";
/// Subject common name of the development CA.
pub const DEV_CA_COMMON_NAME: &str = "Rill development CA";
/// Longest wait for another process that is creating the development CA.
pub const DEV_CA_LOCK_WAIT: Duration = Duration::from_secs(30);
/// Pause between attempts to take the creation lock.
const DEV_CA_LOCK_POLL: Duration = Duration::from_millis(10);
/// Names every development broker certificate is valid for, besides those asked for.
pub const DEV_CERT_DEFAULT_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
/// Upper bound on the names one issued certificate may carry.
pub const CERT_NAMES_MAX: usize = 64;

/// The Rill home directory: `$RILL_HOME` if set and non-empty, else `$HOME/.rill`
/// (else `.rill` in the working directory when neither is set).
pub fn rill_home() -> PathBuf {
    if let Some(home) = std::env::var_os("RILL_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home);
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => PathBuf::from(home).join(".rill"),
        None => PathBuf::from(".rill"),
    }
}

/// Path of the development CA certificate under `home`.
pub fn dev_ca_cert_path(home: &Path) -> PathBuf {
    home.join(DEV_CA_CERT_FILE)
}

/// A loaded development CA, able to sign broker (and client) certificates.
pub struct DevCa {
    cert_path: PathBuf,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for DevCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("DevCa")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

/// Loads the development CA from `home`, creating it (and `home`) on first use.
///
/// Safe to call from several threads or processes at once: exactly one CA results.
pub fn ensure_dev_ca(home: &Path) -> Result<DevCa, NetError> {
    create_home(home)?;
    let cert_path = home.join(DEV_CA_CERT_FILE);
    let key_path = home.join(DEV_CA_KEY_FILE);
    let _lock = lock_exclusive(&home.join(DEV_CA_LOCK_FILE))?;

    if cert_path.exists() {
        return load(&cert_path, &key_path);
    }

    let key = KeyPair::generate().map_err(|source| NetError::CertGen {
        what: "the development CA key",
        source,
    })?;
    let cert = ca_params(&key)
        .self_signed(&key)
        .map_err(|source| NetError::CertGen {
            what: "the development CA certificate",
            source,
        })?;
    write_atomic(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_atomic(&cert_path, cert.pem().as_bytes(), 0o644)?;
    tracing::info!(cert = %cert_path.display(), "created the Rill development CA");
    Ok(DevCa {
        cert_path,
        cert_der: cert.der().clone(),
        issuer: Issuer::new(ca_params(&key), key),
    })
}

impl DevCa {
    /// Where the CA certificate lives; clients trust this file.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The CA certificate (DER).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Issues a broker certificate valid for `localhost`, `127.0.0.1`, `::1` and
    /// each of `names` (an IP address if it parses as one, else a DNS name).
    /// Returns the chain to present (the leaf; clients hold the CA) and its key.
    pub fn issue_server_cert(
        &self,
        names: &[String],
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), NetError> {
        let all = with_default_names(names);
        self.issue(
            &all,
            "Rill broker",
            &[ExtendedKeyUsagePurpose::ServerAuth],
            None,
        )
    }

    /// Issues a client certificate whose principal is `name` (its common name;
    /// see [`crate::identity`]). `name` must be a valid principal name
    /// ([`crate::identity::check_principal_name`]).
    pub fn issue_client_cert(
        &self,
        name: &str,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), NetError> {
        crate::identity::check_principal_name(name)?;
        // A DNS-shaped name is also put in the subject alternative names, as
        // before; other principal names ("alice@example") live in the CN only.
        let names = match san(name) {
            Ok(SanType::DnsName(_)) => vec![name.to_string()],
            _ => Vec::new(),
        };
        self.issue(&names, name, &[ExtendedKeyUsagePurpose::ClientAuth], None)
    }

    /// Issues broker `id`'s certificate: valid as a server for `localhost`,
    /// `127.0.0.1`, `::1` and `names`, and as a client, carrying the broker mark
    /// ([`crate::identity::broker_uri`]) that makes its holder the broker
    /// principal `id` to every broker that trusts this CA.
    pub fn issue_broker_cert(
        &self,
        id: i32,
        names: &[String],
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), NetError> {
        let all = with_default_names(names);
        let uri = crate::identity::broker_uri(id);
        let uri = SanType::URI(
            uri.clone()
                .try_into()
                .map_err(|_| NetError::InvalidCertName { name: uri })?,
        );
        self.issue(
            &all,
            &format!("broker-{id}"),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Some(uri),
        )
    }

    fn issue(
        &self,
        names: &[String],
        common_name: &str,
        usages: &[ExtendedKeyUsagePurpose],
        extra_san: Option<SanType>,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), NetError> {
        if names.len() > CERT_NAMES_MAX {
            return Err(NetError::InvalidCertName {
                name: format!("({} names, at most {CERT_NAMES_MAX} allowed)", names.len()),
            });
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Rill");
        params.subject_alt_names = names.iter().map(|n| san(n)).collect::<Result<_, _>>()?;
        params.subject_alt_names.extend(extra_san);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;

        let key = KeyPair::generate().map_err(|source| NetError::CertGen {
            what: "a certificate key",
            source,
        })?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| NetError::CertGen {
                what: "a certificate signed by the development CA",
                source,
            })?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone()], key_der))
    }
}

/// The CA's parameters. Deterministic given the key: issued certificates name
/// this subject as their issuer, so it must match the stored `ca.pem`.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let common_name = format!(
        "{DEV_CA_COMMON_NAME} {:016x}",
        fnv1a64(key.public_key_raw())
    );
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "Rill");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// FNV-1a, 64 bits: a stable fingerprint (not a security property; the CA is
/// verified by signature).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `localhost`, `127.0.0.1`, `::1`, then each of `names` not among them.
fn with_default_names(names: &[String]) -> Vec<String> {
    let mut all: Vec<String> = DEV_CERT_DEFAULT_NAMES
        .iter()
        .map(|n| n.to_string())
        .collect();
    for name in names {
        if !all.contains(name) {
            all.push(name.clone());
        }
    }
    all
}

fn san(name: &str) -> Result<SanType, NetError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let invalid = || NetError::InvalidCertName {
        name: name.to_string(),
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(invalid());
    }
    Ok(SanType::DnsName(
        name.to_string().try_into().map_err(|_| invalid())?,
    ))
}

fn load(cert_path: &Path, key_path: &Path) -> Result<DevCa, NetError> {
    let cert_der = CertificateDer::from_pem_file(cert_path)
        .map_err(|e| NetError::pem("the development CA certificate", cert_path, e))?;
    let key_pem = fs::read_to_string(key_path).map_err(|e| NetError::io("read", key_path, e))?;
    let key = KeyPair::from_pem(&key_pem)
        .map_err(|e| NetError::pem("the development CA key", key_path, e))?;
    // The certificate embeds the CA's public key; a key from another CA is refused
    // here rather than producing broker certificates no client can verify.
    let public = key.public_key_raw();
    if !cert_der.windows(public.len()).any(|w| w == public) {
        return Err(NetError::DevCaMismatch {
            key: key_path.to_path_buf(),
            cert: cert_path.to_path_buf(),
        });
    }
    Ok(DevCa {
        cert_path: cert_path.to_path_buf(),
        cert_der,
        issuer: Issuer::new(ca_params(&key), key),
    })
}

fn create_home(home: &Path) -> Result<(), NetError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(home)
        .map_err(|e| NetError::io("create the directory", home, e))
}

/// Takes an exclusive advisory lock on `path` (created if missing), waiting at
/// most [`DEV_CA_LOCK_WAIT`]. The lock is released when the file is dropped.
fn lock_exclusive(path: &Path) -> Result<File, NetError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| NetError::io("open the lock file", path, e))?;
    let deadline = Instant::now() + DEV_CA_LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(DEV_CA_LOCK_POLL)
            }
            Err(TryLockError::WouldBlock) => {
                return Err(NetError::Timeout {
                    what: "waiting for another process to create the development CA (lock ca.lock)",
                    after: DEV_CA_LOCK_WAIT,
                });
            }
            Err(TryLockError::Error(e)) => return Err(NetError::io("lock", path, e)),
        }
    }
}

/// Writes an issued certificate chain and its key as PEM files `dir/NAME.pem`
/// and `dir/NAME-key.pem` (mode 0600; `dir` is created, mode 0700), each
/// replaced whole. Returns the two paths.
pub fn write_cert_files(
    dir: &Path,
    name: &str,
    chain: &[CertificateDer<'_>],
    key: &PrivateKeyDer<'_>,
) -> Result<(PathBuf, PathBuf), NetError> {
    create_home(dir)?;
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}-key.pem"));
    let certs: Vec<pem::Pem> = chain
        .iter()
        .map(|c| pem::Pem::new("CERTIFICATE", c.as_ref().to_vec()))
        .collect();
    let label = match key {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        _ => "PRIVATE KEY",
    };
    let key_pem = pem::Pem::new(label, key.secret_der().to_vec());
    write_atomic(&key_path, pem::encode(&key_pem).as_bytes(), 0o600)?;
    write_atomic(&cert_path, pem::encode_many(&certs).as_bytes(), 0o644)?;
    Ok((cert_path, key_path))
}

/// Writes `contents` to `path` so that a crash leaves either the old file or the
/// new one: temp file, fsync, rename, fsync the directory.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), NetError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(NetError::io("remove the stale temp file", &tmp, e)),
    }
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options
        .open(&tmp)
        .map_err(|e| NetError::io("create", &tmp, e))?;
    file.write_all(contents)
        .map_err(|e| NetError::io("write", &tmp, e))?;
    file.sync_all()
        .map_err(|e| NetError::io("fsync", &tmp, e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| NetError::io("rename into place", path, e))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| NetError::io("fsync the directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_then_reuses_the_ca() {
        let home = tempfile::tempdir().unwrap();
        let first = ensure_dev_ca(home.path()).unwrap();
        let second = ensure_dev_ca(home.path()).unwrap();
        assert_eq!(first.cert_der(), second.cert_der());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(home.path().join(DEV_CA_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // No temp files are left behind.
        let leftovers: Vec<_> = fs::read_dir(home.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn concurrent_creation_yields_one_ca() {
        let home = tempfile::tempdir().unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let home = home.path().to_path_buf();
                std::thread::spawn(move || ensure_dev_ca(&home).unwrap().cert_der().clone())
            })
            .collect();
        let certs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(certs.iter().all(|c| c == &certs[0]));
        let on_disk = CertificateDer::from_pem_file(home.path().join(DEV_CA_CERT_FILE)).unwrap();
        assert_eq!(on_disk, certs[0]);
    }

    #[test]
    fn a_key_from_another_ca_is_refused() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        ensure_dev_ca(a.path()).unwrap();
        ensure_dev_ca(b.path()).unwrap();
        fs::copy(
            b.path().join(DEV_CA_KEY_FILE),
            a.path().join(DEV_CA_KEY_FILE),
        )
        .unwrap();
        let err = ensure_dev_ca(a.path()).unwrap_err();
        assert!(matches!(err, NetError::DevCaMismatch { .. }), "{err}");
    }

    #[test]
    fn invalid_names_are_refused() {
        let home = tempfile::tempdir().unwrap();
        let ca = ensure_dev_ca(home.path()).unwrap();
        assert!(
            ca.issue_server_cert(&["broker-1.example".into(), "10.0.0.7".into()])
                .is_ok()
        );
        let err = ca.issue_server_cert(&["not a name".into()]).unwrap_err();
        assert!(err.to_string().contains("not a name"), "{err}");
    }

    #[test]
    fn rill_home_prefers_the_environment() {
        // Only reads the environment; never writes to the real home.
        let home = rill_home();
        match std::env::var_os("RILL_HOME").filter(|h| !h.is_empty()) {
            Some(h) => assert_eq!(home, PathBuf::from(h)),
            None => assert!(home.ends_with(".rill")),
        }
    }
}
