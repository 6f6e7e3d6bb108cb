//! TLS configuration for brokers ([`ServerTls`]) and clients ([`ClientTls`]).
//!
//! Invariants: TLS 1.3 only (QUIC requires it), one crypto provider (AWS-LC, with *ring*'s AEAD where it is faster; see [`crypto_provider`]),
//! ALPN [`ALPN`] on both sides (a peer that does not offer it is refused), and
//! the peer's certificate is always verified — there is no "insecure" mode.
//!
//! Certificate and key files are PEM. A certificate file may hold a chain (leaf
//! first); a CA file may hold several roots. Keys may be PKCS#8, PKCS#1 or SEC1.

use std::error::Error as StdError;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};

use crate::dev_ca::{DEV_CA_CERT_FILE, ensure_dev_ca};
use crate::error::NetError;

/// The ALPN protocol id of Rill's wire protocol, version 1.
pub const ALPN: &[u8] = b"rill/1";

/// Most certificates accepted from one PEM file.
pub const PEM_CERTS_MAX: usize = 64;

/// How a broker proves its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerTls {
    /// A certificate issued at start-up by the development CA in `home` (created
    /// on first use), valid for localhost, 127.0.0.1, ::1, this machine's host
    /// name and the specific listen address.
    Dev { home: PathBuf },
    /// As `Dev`, and also valid for `names` (DNS names or IP addresses), e.g. the
    /// address the broker advertises to other machines.
    DevWithNames { home: PathBuf, names: Vec<String> },
    /// A certificate chain and key from PEM files, and whether clients present
    /// certificates ([`ClientAuth`]).
    Files {
        cert: PathBuf,
        key: PathBuf,
        client_auth: ClientAuth,
    },
}

/// Whether a broker asks its clients for certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificates.
    None,
    /// A client may present a certificate signed by a CA in this file (a broker
    /// does, to be known as one); one that presents none is anonymous.
    Optional(PathBuf),
    /// Every client must present a certificate signed by a CA in this file.
    Required(PathBuf),
}

/// Whom a client (or a replicating broker) trusts, and how it identifies itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientTls {
    /// Trust the development CA at `home/ca.pem` (see [`crate::rill_home`]).
    Dev { home: PathBuf },
    /// Trust the CA certificate(s) in this PEM file.
    CaFile(PathBuf),
    /// Trust the CAs in `ca` and present the certificate chain `cert` with `key`
    /// (for brokers that require client certificates).
    Mutual {
        ca: PathBuf,
        cert: PathBuf,
        key: PathBuf,
    },
}

/// The crypto provider used everywhere: AWS-LC (rustls's default) for key
/// exchange, signatures and randomness, with the TLS 1.3 cipher suites of
/// whichever library seals and opens QUIC's packets faster on this CPU
/// ([`AeadLibrary::for_this_cpu`]), preferring the cheapest AEAD the CPU runs
/// in hardware (see [`preferred_suites`]).
pub fn crypto_provider() -> Arc<CryptoProvider> {
    crypto_provider_with(AeadLibrary::for_this_cpu())
}

/// [`crypto_provider`] with the cipher suites of `aead`.
pub fn crypto_provider_with(aead: AeadLibrary) -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if aead == AeadLibrary::Ring {
        provider.cipher_suites = rustls::crypto::ring::default_provider().cipher_suites;
    }
    provider.cipher_suites = preferred_suites(provider.cipher_suites, aes_in_hardware());
    Arc::new(provider)
}

/// Which library's AES-GCM seals and opens QUIC's packets (up to 64 KiB on
/// loopback and jumbo-frame paths). Each has one wide-vector code path the
/// other lacks: AWS-LC's uses AVX-512 with VAES, and has no VAES path for
/// CPUs without AVX-512 (it falls back to 128-bit AES-NI there); *ring*'s uses
/// VAES on 256-bit AVX2 registers, and stops there. So on a CPU with VAES but
/// no AVX-512 (AMD Zen 3, Intel Alder Lake) *ring* is 2-2.5x faster, and with
/// AVX-512 AWS-LC is (docs/BENCHMARKS.md has both measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AeadLibrary {
    AwsLc,
    Ring,
}

/// What [`AeadLibrary::choose`] asks of the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VectorAes {
    /// VAES and VPCLMULQDQ: AES rounds and carry-less multiplies on whole
    /// vector registers.
    pub vaes: bool,
    /// AVX2, for *ring*'s 256-bit path.
    pub avx2: bool,
    /// AVX-512 F, BW, DQ and VL, as AWS-LC's 512-bit path requires (and a
    /// platform where AWS-LC uses it).
    pub avx512: bool,
}

impl AeadLibrary {
    /// AWS-LC unless *ring* has the faster path for this CPU: VAES on AVX2
    /// where AWS-LC has no VAES path (no AVX-512). Without VAES both use
    /// 128-bit AES-NI code, and AWS-LC stays.
    pub fn choose(cpu: VectorAes) -> AeadLibrary {
        if cpu.vaes && cpu.avx2 && !cpu.avx512 {
            AeadLibrary::Ring
        } else {
            AeadLibrary::AwsLc
        }
    }

    /// [`AeadLibrary::choose`] for the CPU this process runs on.
    pub fn for_this_cpu() -> AeadLibrary {
        AeadLibrary::choose(VectorAes::of_this_cpu())
    }
}

impl VectorAes {
    /// What this CPU (and the OS, for the wide registers) supports.
    pub fn of_this_cpu() -> VectorAes {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            VectorAes {
                vaes: has!("vaes") && has!("vpclmulqdq"),
                avx2: has!("avx2"),
                // AWS-LC keeps its AVX-512 AES-GCM off on Windows.
                avx512: !cfg!(windows)
                    && has!("avx512f")
                    && has!("avx512bw")
                    && has!("avx512dq")
                    && has!("avx512vl"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            VectorAes::default()
        }
    }
}

/// Whether this CPU has AES and carry-less multiply instructions (what
/// AES-GCM needs to be fast).
fn aes_in_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// The TLS 1.3 suites in the order both ends of a Rill connection prefer
/// (rustls's server follows the client's order, and both run this): with AES
/// in hardware, AES-128-GCM first (64 KiB packets sealed about 15% faster
/// than with AES-256-GCM here, and every QUIC peer must support it), else
/// ChaCha20-Poly1305 (several times faster than AES without the
/// instructions). Every suite stays offered; only the order changes.
pub fn preferred_suites(
    mut suites: Vec<rustls::SupportedCipherSuite>,
    aes_in_hardware: bool,
) -> Vec<rustls::SupportedCipherSuite> {
    use rustls::CipherSuite::{TLS13_AES_128_GCM_SHA256, TLS13_CHACHA20_POLY1305_SHA256};
    let first = if aes_in_hardware {
        TLS13_AES_128_GCM_SHA256
    } else {
        TLS13_CHACHA20_POLY1305_SHA256
    };
    // A stable sort: the rest keep the provider's order.
    suites.sort_by_key(|s| s.suite() != first);
    suites
}

impl ServerTls {
    /// Builds the rustls server configuration (TLS 1.3, ALPN `rill/1`).
    pub fn rustls_config(&self) -> Result<rustls::ServerConfig, NetError> {
        self.build(None)
    }

    /// As [`Self::rustls_config`]; a specific (not unspecified) `listen_ip` is
    /// added to the names of a development certificate.
    pub(crate) fn build(
        &self,
        listen_ip: Option<IpAddr>,
    ) -> Result<rustls::ServerConfig, NetError> {
        let (chain, key, client_auth) = match self {
            ServerTls::Dev { home } => {
                let (chain, key) = dev_server_cert(home, &[], listen_ip)?;
                (chain, key, &ClientAuth::None)
            }
            ServerTls::DevWithNames { home, names } => {
                let (chain, key) = dev_server_cert(home, names, listen_ip)?;
                (chain, key, &ClientAuth::None)
            }
            ServerTls::Files {
                cert,
                key,
                client_auth,
            } => (
                load_certs(cert, "the broker certificate")?,
                load_key(key)?,
                client_auth,
            ),
        };
        let provider = crypto_provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?;
        let builder = match client_auth {
            ClientAuth::None => builder.with_no_client_auth(),
            ClientAuth::Optional(path) | ClientAuth::Required(path) => {
                let roots = load_roots(path)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = match client_auth {
                    ClientAuth::Optional(_) => verifier.allow_unauthenticated(),
                    _ => verifier,
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| NetError::pem("client CA certificates", path, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }
}

impl ClientTls {
    /// The CA file this client trusts.
    pub fn ca_path(&self) -> PathBuf {
        match self {
            ClientTls::Dev { home } => home.join(DEV_CA_CERT_FILE),
            ClientTls::CaFile(path) => path.clone(),
            ClientTls::Mutual { ca, .. } => ca.clone(),
        }
    }

    /// Builds the rustls client configuration (TLS 1.3, ALPN `rill/1`, server
    /// certificate verified against [`Self::ca_path`]).
    pub fn rustls_config(&self) -> Result<rustls::ClientConfig, NetError> {
        self.rustls_config_with(AeadLibrary::for_this_cpu())
    }

    /// [`Self::rustls_config`], sealing with `aead`'s cipher suites whatever
    /// this CPU would choose.
    pub fn rustls_config_with(&self, aead: AeadLibrary) -> Result<rustls::ClientConfig, NetError> {
        let provider = crypto_provider_with(aead);
        let ca_path = self.ca_path();
        if matches!(self, ClientTls::Dev { .. }) && !ca_path.exists() {
            return Err(NetError::NoDevCa { path: ca_path });
        }
        let roots = load_roots(&ca_path)?;
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| NetError::pem("CA certificates", &ca_path, e))?;
        let verifier = Arc::new(CaNamingVerifier {
            inner: webpki,
            ca_path,
        });
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match self {
            ClientTls::Mutual { cert, key, .. } => builder.with_client_auth_cert(
                load_certs(cert, "the client certificate")?,
                load_key(key)?,
            )?,
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }
}

fn dev_server_cert(
    home: &Path,
    names: &[String],
    listen_ip: Option<IpAddr>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), NetError> {
    let ca = ensure_dev_ca(home)?;
    let mut all = names.to_vec();
    if let Some(ip) = listen_ip.filter(|ip| !ip.is_unspecified()) {
        all.push(ip.to_string());
    }
    if let Some(host) = host_name() {
        all.push(host);
    }
    ca.issue_server_cert(&all)
}

/// This machine's host name, if it is a plausible DNS name.
pub fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()?;
    let name = name.trim().to_ascii_lowercase();
    let plausible = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    plausible.then_some(name)
}

fn load_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| NetError::pem(what, path, e))?;
    let mut certs = Vec::new();
    for cert in iter {
        if certs.len() == PEM_CERTS_MAX {
            return Err(NetError::pem(
                what,
                path,
                format!("more than {PEM_CERTS_MAX} certificates"),
            ));
        }
        certs.push(cert.map_err(|e| NetError::pem(what, path, e))?);
    }
    if certs.is_empty() {
        return Err(NetError::pem(what, path, "no CERTIFICATE section found"));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, NetError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| NetError::pem("a private key", path, e))
}

fn load_roots(path: &Path) -> Result<RootCertStore, NetError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path, "CA certificates")? {
        roots
            .add(cert)
            .map_err(|e| NetError::pem("CA certificates", path, e))?;
    }
    Ok(roots)
}

/// Marks the start of the message [`NotSignedByCa`] puts into a handshake error.
pub(crate) const NOT_SIGNED_MESSAGE_START: &str =
    "the broker's certificate is not signed by the CA at";

/// The verification error for a certificate from an unknown issuer, naming the
/// CA file the client trusted (rustls alone cannot know it).
struct NotSignedByCa {
    ca_path: PathBuf,
}

impl fmt::Display for NotSignedByCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{NOT_SIGNED_MESSAGE_START} {}; pass --tls-ca FILE with the CA that signed it",
            self.ca_path.display()
        )
    }
}

// rustls formats certificate errors with `{:?}`; make that read as the message.
impl fmt::Debug for NotSignedByCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl StdError for NotSignedByCa {}

/// WebPKI verification, with "unknown issuer" reported as [`NotSignedByCa`].
#[derive(Debug)]
struct CaNamingVerifier {
    inner: Arc<WebPkiServerVerifier>,
    ca_path: PathBuf,
}

impl ServerCertVerifier for CaNamingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|e| match e {
                // BadSignature: an issuer of the same name (another development
                // CA, say) whose key did not sign this certificate.
                #[allow(deprecated)]
                rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer | CertificateError::BadSignature,
                ) => rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(
                    Arc::new(NotSignedByCa {
                        ca_path: self.ca_path.clone(),
                    }),
                ))),
                other => other,
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_dev_ca_says_what_to_do() {
        let home = tempfile::tempdir().unwrap();
        let err = ClientTls::Dev {
            home: home.path().to_path_buf(),
        }
        .rustls_config()
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("no Rill development CA at"), "{msg}");
        assert!(
            msg.contains("start a broker on this machine first"),
            "{msg}"
        );
        assert!(msg.contains("--tls-ca FILE"), "{msg}");
    }

    #[test]
    fn ring_seals_only_where_it_has_vaes_and_aws_lc_has_no_avx512_path() {
        use AeadLibrary::{AwsLc, Ring};
        for (vaes, avx2, avx512, chosen, cpu) in [
            (
                true,
                true,
                false,
                Ring,
                "VAES on AVX2 only (Zen 3, Alder Lake)",
            ),
            (
                true,
                true,
                true,
                AwsLc,
                "AWS-LC's AVX-512 path (Zen 4, Ice Lake)",
            ),
            (
                false,
                true,
                false,
                AwsLc,
                "no VAES: both run 128-bit AES-NI code",
            ),
            (false, false, false, AwsLc, "neither"),
            (true, false, false, AwsLc, "VAES without AVX2"),
        ] {
            let got = AeadLibrary::choose(VectorAes { vaes, avx2, avx512 });
            assert_eq!(got, chosen, "{cpu}");
        }

        // The provider carries the chosen library's suites, and only the AEAD
        // changes: key exchange stays AWS-LC's.
        let suites = |aead| suites_of(&crypto_provider_with(aead));
        let ring = suites_of(&rustls::crypto::ring::default_provider());
        let aws_lc = suites_of(&rustls::crypto::aws_lc_rs::default_provider());
        assert_eq!(suites(AeadLibrary::Ring), ring);
        assert_eq!(suites(AeadLibrary::AwsLc), aws_lc);
        assert!(ring.iter().all(|s| !aws_lc.contains(s)));
        let kx = |aead| -> Vec<_> {
            crypto_provider_with(aead)
                .kx_groups
                .iter()
                .map(|g| g.name())
                .collect()
        };
        assert_eq!(kx(AeadLibrary::Ring), kx(AeadLibrary::AwsLc));
    }

    /// The addresses of `p`'s TLS 1.3 suites, sorted: each library's suites
    /// are statics of its own, so two providers' lists can be told apart.
    fn suites_of(p: &CryptoProvider) -> Vec<*const rustls::Tls13CipherSuite> {
        let mut suites: Vec<_> = p
            .cipher_suites
            .iter()
            .filter_map(|s| s.tls13().map(|t| t as *const _))
            .collect();
        suites.sort();
        suites
    }

    #[test]
    fn the_cheapest_aead_in_hardware_comes_first_and_nothing_is_dropped() {
        use rustls::CipherSuite::*;
        let default = rustls::crypto::aws_lc_rs::default_provider().cipher_suites;
        let names = |aes| -> Vec<_> {
            preferred_suites(default.clone(), aes)
                .iter()
                .map(|s| s.suite())
                .collect()
        };
        let with_aes = names(true);
        assert_eq!(with_aes[0], TLS13_AES_128_GCM_SHA256, "{with_aes:?}");
        assert_eq!(with_aes[1], TLS13_AES_256_GCM_SHA384, "{with_aes:?}");
        let without = names(false);
        assert_eq!(without[0], TLS13_CHACHA20_POLY1305_SHA256, "{without:?}");
        assert_eq!(with_aes.len(), default.len());
        assert_eq!(without.len(), default.len());
        // What the configs use is the same order.
        let home = tempfile::tempdir().unwrap();
        let client = ClientTls::Dev {
            home: home.path().to_path_buf(),
        };
        let server = ServerTls::Dev {
            home: home.path().to_path_buf(),
        }
        .rustls_config()
        .unwrap();
        let client_config = client.rustls_config().unwrap();
        let used: Vec<_> = client_config
            .crypto_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(used, names(aes_in_hardware()));
        // Both configs seal with the library this CPU chooses.
        let chosen = suites_of(&crypto_provider_with(AeadLibrary::for_this_cpu()));
        assert_eq!(suites_of(server.crypto_provider()), chosen);
        assert_eq!(suites_of(client_config.crypto_provider()), chosen);
        // A client config asked for a library's AEAD carries its suites.
        for aead in [AeadLibrary::AwsLc, AeadLibrary::Ring] {
            let config = client.rustls_config_with(aead).unwrap();
            assert_eq!(
                suites_of(config.crypto_provider()),
                suites_of(&crypto_provider_with(aead)),
                "{aead:?}"
            );
        }
    }

    #[test]
    fn configs_are_tls13_only_with_alpn() {
        let home = tempfile::tempdir().unwrap();
        let server = ServerTls::Dev {
            home: home.path().to_path_buf(),
        }
        .rustls_config()
        .unwrap();
        assert_eq!(server.alpn_protocols, vec![ALPN.to_vec()]);
        let client = ClientTls::Dev {
            home: home.path().to_path_buf(),
        }
        .rustls_config()
        .unwrap();
        assert_eq!(client.alpn_protocols, vec![ALPN.to_vec()]);
        assert!(
            client
                .crypto_provider()
                .cipher_suites
                .iter()
                .any(|s| s.tls13().is_some())
        );
    }

    #[test]
    fn files_that_are_not_pem_are_refused_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let bogus = dir.path().join("bogus.pem");
        std::fs::write(&bogus, "not a certificate\n").unwrap();
        let err = ClientTls::CaFile(bogus.clone())
            .rustls_config()
            .unwrap_err();
        assert!(
            err.to_string().contains(&bogus.display().to_string()),
            "{err}"
        );
        let err = ServerTls::Files {
            cert: bogus.clone(),
            key: bogus.clone(),
            client_auth: ClientAuth::None,
        }
        .rustls_config()
        .unwrap_err();
        assert!(err.to_string().contains("bogus.pem"), "{err}");
    }
}
