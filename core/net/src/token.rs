//! Bearer tokens for the web console: `rill token issue --principal NAME --ttl 1h`.
//!
//! A token is a JSON Web Token (RFC 7519) signed with the cluster CA's private
//! key — the key that signs client certificates — and verified with the CA
//! certificate the broker already trusts for them. Holding the CA key already
//! lets one mint a certificate for any principal, so a token grants nothing a
//! certificate could not; a token is just easier to paste into a browser.
//!
//! Claims: `sub` (the principal's name, the rules of a certificate's common
//! name), `iat` and `exp` (seconds since the epoch), `aud` = [`AUDIENCE`]
//! (a token is accepted by the console only, not as a credential of the
//! native or Kafka protocols). Algorithms: ES256 (P-256 key, as the
//! development CA's), ES384 (P-384) and EdDSA (Ed25519); an RSA CA key is
//! refused with that reason.
//!
//! Invariants: a token verifies only with a CA certificate whose public key
//! matches the header's algorithm; expired tokens (no leeway) and tokens
//! issued more than [`CLOCK_SKEW`] in the future or longer-lived than
//! [`TTL_MAX`] are refused; there
//! is no revocation list, so lifetimes are short (the `--ttl`, at most 7 days,
//! as Kafka's delegation tokens' default maximum).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, UnparsedPublicKey};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use x509_parser::prelude::FromDer;

use crate::error::NetError;
use crate::identity::check_principal_name;

/// The `aud` claim of console tokens.
pub const AUDIENCE: &str = "rill-console";
/// The longest lifetime a token may have.
pub const TTL_MAX: Duration = Duration::from_secs(7 * 24 * 3600);
/// How far a token's `iat` may lie in the future (clocks of the issuing machine
/// and the broker differ a little).
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// Longest token accepted (a real one is about 300 bytes).
const TOKEN_BYTES_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alg {
    Es256,
    Es384,
    EdDsa,
}

impl Alg {
    fn name(self) -> &'static str {
        match self {
            Alg::Es256 => "ES256",
            Alg::Es384 => "ES384",
            Alg::EdDsa => "EdDSA",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: String,
}

/// What a token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The principal's name (`User:NAME` in ACL terms).
    pub sub: String,
    pub iat: u64,
    pub exp: u64,
    pub aud: String,
}

/// Why a token is refused (each message names what was wrong).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is malformed: {0}")]
    Malformed(String),
    #[error("the token is not signed by the cluster's CA")]
    BadSignature,
    #[error("the token expired {0} s ago; issue a new one with `rill token issue`")]
    Expired(u64),
    #[error("the token was issued in the future (check the clocks)")]
    NotYetValid,
    #[error("the token is for {0:?}, not for the console ({AUDIENCE:?})")]
    WrongAudience(String),
    #[error("the token lives longer than the most a token may ({} h)", TTL_MAX.as_secs() / 3600)]
    TooLong,
    #[error("the token's principal {0:?} is not a principal name")]
    BadPrincipal(String),
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A signing key read from a CA's private key file.
enum Signer {
    Ecdsa(EcdsaKeyPair, Alg),
    Ed25519(Ed25519KeyPair),
}

impl Signer {
    fn from_pem_file(path: &Path) -> Result<Signer, NetError> {
        let what = "the CA private key";
        let key = PrivateKeyDer::from_pem_file(path).map_err(|e| NetError::pem(what, path, e))?;
        let PrivateKeyDer::Pkcs8(der) = key else {
            return Err(NetError::pem(
                what,
                path,
                "not a PKCS#8 key (\"BEGIN PRIVATE KEY\"); convert it with `openssl pkcs8 -topk8 -nocrypt`",
            ));
        };
        let der = der.secret_pkcs8_der();
        let rng = SystemRandom::new();
        for (alg, ring_alg) in [
            (Alg::Es256, &signature::ECDSA_P256_SHA256_FIXED_SIGNING),
            (Alg::Es384, &signature::ECDSA_P384_SHA384_FIXED_SIGNING),
        ] {
            if let Ok(k) = EcdsaKeyPair::from_pkcs8(ring_alg, der, &rng) {
                return Ok(Signer::Ecdsa(k, alg));
            }
        }
        if let Ok(k) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der) {
            return Ok(Signer::Ed25519(k));
        }
        Err(NetError::pem(
            what,
            path,
            "tokens are signed with ECDSA P-256 or P-384 or Ed25519 keys, and this key is none of \
             those (an RSA CA cannot sign console tokens)",
        ))
    }

    fn alg(&self) -> Alg {
        match self {
            Signer::Ecdsa(_, alg) => *alg,
            Signer::Ed25519(_) => Alg::EdDsa,
        }
    }

    fn sign(&self, msg: &[u8]) -> Vec<u8> {
        match self {
            Signer::Ecdsa(k, _) => k
                .sign(&SystemRandom::new(), msg)
                .expect("ECDSA signing with the system's random source")
                .as_ref()
                .to_vec(),
            Signer::Ed25519(k) => k.sign(msg).as_ref().to_vec(),
        }
    }
}

/// Issues a token for `principal`, valid for `ttl` from `now`, signed with the
/// CA private key in `ca_key` (PEM, PKCS#8).
pub fn issue(
    ca_key: &Path,
    principal: &str,
    ttl: Duration,
    now: SystemTime,
) -> Result<String, NetError> {
    check_principal_name(principal)?;
    if ttl.is_zero() || ttl > TTL_MAX {
        return Err(NetError::TokenTtl {
            secs: ttl.as_secs(),
        });
    }
    let signer = Signer::from_pem_file(ca_key)?;
    let iat = unix_secs(now);
    let claims = Claims {
        sub: principal.to_string(),
        iat,
        exp: iat + ttl.as_secs(),
        aud: AUDIENCE.to_string(),
    };
    Ok(encode(&signer, &claims))
}

fn encode(signer: &Signer, claims: &Claims) -> String {
    let header = Header {
        alg: signer.alg().name().into(),
        typ: "JWT".into(),
    };
    let mut out = B64.encode(serde_json::to_vec(&header).expect("JSON encodes"));
    out.push('.');
    out.push_str(&B64.encode(serde_json::to_vec(claims).expect("JSON encodes")));
    let sig = signer.sign(out.as_bytes());
    out.push('.');
    out.push_str(&B64.encode(sig));
    out
}

/// Checks tokens against the public keys of CA certificates.
#[derive(Debug, Clone)]
pub struct TokenVerifier {
    keys: Vec<(Alg, Vec<u8>)>,
}

impl TokenVerifier {
    /// The keys of the CA certificates in `ca_file` (PEM). CAs whose keys
    /// cannot sign tokens (RSA) are left out; none at all is an error.
    pub fn from_ca_file(ca_file: &Path) -> Result<TokenVerifier, NetError> {
        let what = "the CA certificates for console tokens";
        let mut keys = Vec::new();
        for cert in
            CertificateDer::pem_file_iter(ca_file).map_err(|e| NetError::pem(what, ca_file, e))?
        {
            let cert = cert.map_err(|e| NetError::pem(what, ca_file, e))?;
            if let Some(k) = public_key_of(&cert) {
                keys.push(k);
            }
        }
        if keys.is_empty() {
            return Err(NetError::pem(
                what,
                ca_file,
                "no CA certificate with an ECDSA P-256, P-384 or Ed25519 key (tokens cannot be \
                 checked with RSA CAs)",
            ));
        }
        Ok(TokenVerifier { keys })
    }

    /// The principal's name `token` carries, if it is valid at `now`.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<String, TokenError> {
        self.verify_claims(token, now).map(|c| c.sub)
    }

    /// What `token` says, if it is valid at `now`.
    pub fn verify_claims(&self, token: &str, now: SystemTime) -> Result<Claims, TokenError> {
        let malformed = |why: &str| TokenError::Malformed(why.to_string());
        if token.len() > TOKEN_BYTES_MAX {
            return Err(malformed("longer than any token `rill token issue` makes"));
        }
        let mut parts = token.trim().split('.');
        let (Some(h), Some(c), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("not three base64url parts separated by '.'"));
        };
        let part = |p: &str, what: &str| {
            B64.decode(p)
                .map_err(|e| TokenError::Malformed(format!("its {what} is not base64url: {e}")))
        };
        let header: Header = serde_json::from_slice(&part(h, "header")?)
            .map_err(|e| TokenError::Malformed(format!("its header is not JWT JSON: {e}")))?;
        let sig = part(s, "signature")?;
        let signed = &token.trim()[..h.len() + 1 + c.len()];
        let verified = self.keys.iter().any(|(alg, key)| {
            if alg.name() != header.alg {
                return false;
            }
            let ring_alg: &dyn signature::VerificationAlgorithm = match alg {
                Alg::Es256 => &signature::ECDSA_P256_SHA256_FIXED,
                Alg::Es384 => &signature::ECDSA_P384_SHA384_FIXED,
                Alg::EdDsa => &signature::ED25519,
            };
            UnparsedPublicKey::new(ring_alg, key)
                .verify(signed.as_bytes(), &sig)
                .is_ok()
        });
        if !verified {
            return Err(TokenError::BadSignature);
        }
        let claims: Claims = serde_json::from_slice(&part(c, "claims")?)
            .map_err(|e| TokenError::Malformed(format!("its claims are not Rill's: {e}")))?;
        if claims.aud != AUDIENCE {
            return Err(TokenError::WrongAudience(claims.aud));
        }
        let now = unix_secs(now);
        if claims.iat > now + CLOCK_SKEW.as_secs() {
            return Err(TokenError::NotYetValid);
        }
        if claims.exp <= now {
            return Err(TokenError::Expired(now - claims.exp));
        }
        if claims.exp.saturating_sub(claims.iat) > TTL_MAX.as_secs() {
            return Err(TokenError::TooLong);
        }
        check_principal_name(&claims.sub)
            .map_err(|_| TokenError::BadPrincipal(claims.sub.clone()))?;
        Ok(claims)
    }
}

/// The token-signing key of a CA certificate, if it has one we verify.
fn public_key_of(cert: &CertificateDer<'_>) -> Option<(Alg, Vec<u8>)> {
    let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(cert.as_ref()).ok()?;
    let spki = parsed.public_key();
    let oid = spki.algorithm.algorithm.to_id_string();
    let key = spki.subject_public_key.data.to_vec();
    let alg = match oid.as_str() {
        // id-ecPublicKey: the curve by the point's length (uncompressed).
        "1.2.840.10045.2.1" => match key.len() {
            65 => Alg::Es256,
            97 => Alg::Es384,
            _ => return None,
        },
        "1.3.101.112" => Alg::EdDsa,
        _ => return None,
    };
    Some((alg, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev_ca::{DEV_CA_CERT_FILE, DEV_CA_KEY_FILE, ensure_dev_ca};

    #[test]
    fn a_token_of_the_ca_verifies_and_others_do_not() {
        let home = tempfile::tempdir().unwrap();
        ensure_dev_ca(home.path()).unwrap();
        let key = home.path().join(DEV_CA_KEY_FILE);
        let verifier = TokenVerifier::from_ca_file(&home.path().join(DEV_CA_CERT_FILE)).unwrap();
        let now = SystemTime::now();
        let hour = Duration::from_secs(3600);
        let t = issue(&key, "alice", hour, now).unwrap();
        assert_eq!(verifier.verify(&t, now), Ok("alice".into()));
        assert_eq!(verifier.verify(&format!(" {t}\n"), now), Ok("alice".into()));

        // Expired, by the clock of the verifier.
        assert_eq!(
            verifier.verify(&t, now + hour + Duration::from_secs(5)),
            Err(TokenError::Expired(5))
        );
        // Another CA's token.
        let other = tempfile::tempdir().unwrap();
        ensure_dev_ca(other.path()).unwrap();
        let foreign = issue(&other.path().join(DEV_CA_KEY_FILE), "alice", hour, now).unwrap();
        assert_eq!(
            verifier.verify(&foreign, now),
            Err(TokenError::BadSignature)
        );
        // A changed principal breaks the signature.
        let parts: Vec<&str> = t.split('.').collect();
        let mut claims: Claims = serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
        claims.sub = "admin".into();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            B64.encode(serde_json::to_vec(&claims).unwrap()),
            parts[2]
        );
        assert_eq!(verifier.verify(&forged, now), Err(TokenError::BadSignature));
        // "alg": "none" and garbage.
        let none = format!(
            "{}.{}.",
            B64.encode(br#"{"alg":"none","typ":"JWT"}"#),
            parts[1]
        );
        assert_eq!(verifier.verify(&none, now), Err(TokenError::BadSignature));
        assert!(matches!(
            verifier.verify("not-a-token", now),
            Err(TokenError::Malformed(_))
        ));
        // Bad principals and lifetimes are refused at issue.
        assert!(issue(&key, "Broker:1", hour, now).is_err());
        assert!(issue(&key, "alice", TTL_MAX + Duration::from_secs(1), now).is_err());
        // The wrong audience, signed by the right key.
        let signer = Signer::from_pem_file(&key).unwrap();
        let mut c = claims.clone();
        c.sub = "alice".into();
        c.aud = "kafka".into();
        let aud = encode(&signer, &c);
        assert_eq!(
            verifier.verify(&aud, now),
            Err(TokenError::WrongAudience("kafka".into()))
        );
    }
}
