//! SCRAM credentials (RFC 5802, RFC 7677), as Kafka stores them: per user and
//! mechanism a salt, an iteration count, `StoredKey = H(HMAC(SaltedPassword,
//! "Client Key"))` and `ServerKey = HMAC(SaltedPassword, "Server Key")`. The
//! password itself is never kept (nor sent: `rill user add` derives the
//! credential on the client). Pure functions, no I/O; the exchange itself is
//! the Kafka listener's (rill-kafka `sasl.rs`).
//!
//! Invariants: a credential's keys are as long as its mechanism's hash (32
//! bytes for SHA-256, 64 for SHA-512); comparisons of secrets are constant
//! time ([`verify_proof`], [`verify_password`]).

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};

/// Fewest iterations accepted (Kafka's minimum).
pub const ITERATIONS_MIN: u32 = 4096;
/// Most iterations accepted (bounds the cost of one authentication).
pub const ITERATIONS_MAX: u32 = 100_000;
/// Iterations `rill user add` uses unless told otherwise (Kafka's default).
pub const ITERATIONS_DEFAULT: u32 = 8192;
/// Salt length `rill user add` generates; accepted salts are 8 to 64 bytes.
pub const SALT_LEN: usize = 24;
pub const SALT_LEN_MIN: usize = 8;
pub const SALT_LEN_MAX: usize = 64;

/// A SCRAM mechanism Kafka clients speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    /// The SASL name (`SCRAM-SHA-256`).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The hash's output length, and so of the keys.
    pub fn key_len(self) -> usize {
        match self {
            Mechanism::Sha256 => 32,
            Mechanism::Sha512 => 64,
        }
    }

    pub fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
            Mechanism::Sha512 => {
                let mut mac = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, iterations)`: PBKDF2 with this mechanism's HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.key_len()];
        match self {
            Mechanism::Sha256 => {
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
            }
            Mechanism::Sha512 => {
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
            }
        }
        out
    }
}

/// What a broker keeps of one user's password for one mechanism.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct ScramCredential {
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl ScramCredential {
    /// Derives the credential of `password` (the client does this; the
    /// broker receives only the result).
    pub fn derive(
        mechanism: Mechanism,
        password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> ScramCredential {
        let salted = mechanism.salted_password(password, salt, iterations);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        ScramCredential {
            mechanism: mechanism.name().to_string(),
            salt: salt.to_vec(),
            iterations,
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
        }
    }

    /// Why this credential cannot be stored, if it cannot.
    pub fn check(&self) -> Result<Mechanism, String> {
        let m = Mechanism::from_name(&self.mechanism).ok_or_else(|| {
            format!(
                "mechanism {:?} is not SCRAM-SHA-256 or SCRAM-SHA-512",
                self.mechanism
            )
        })?;
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&self.iterations) {
            return Err(format!(
                "{} iterations is outside {ITERATIONS_MIN}..={ITERATIONS_MAX}",
                self.iterations
            ));
        }
        if !(SALT_LEN_MIN..=SALT_LEN_MAX).contains(&self.salt.len()) {
            return Err(format!(
                "a salt of {} bytes is outside {SALT_LEN_MIN}..={SALT_LEN_MAX}",
                self.salt.len()
            ));
        }
        if self.stored_key.len() != m.key_len() || self.server_key.len() != m.key_len() {
            return Err(format!("{} keys are {} bytes", m.name(), m.key_len()));
        }
        Ok(m)
    }

    /// Whether `password` is this credential's (SASL PLAIN against a SCRAM
    /// credential). `false` for a credential that does not [`Self::check`].
    pub fn verify_password(&self, password: &[u8]) -> bool {
        let Ok(m) = self.check() else {
            return false;
        };
        let other = ScramCredential::derive(m, password, &self.salt, self.iterations);
        constant_time_eq(&other.stored_key, &self.stored_key)
    }

    /// Checks a client's proof over `auth_message`; on success the server
    /// signature to send back.
    pub fn verify_proof(&self, auth_message: &[u8], proof: &[u8]) -> Option<Vec<u8>> {
        let m = self.check().ok()?;
        if proof.len() != m.key_len() {
            return None;
        }
        let signature = m.hmac(&self.stored_key, auth_message);
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        if !constant_time_eq(&m.hash(&client_key), &self.stored_key) {
            return None;
        }
        Some(m.hmac(&self.server_key, auth_message))
    }
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil".
    #[test]
    fn rfc_7677_example_verifies() {
        let salt = [
            0x5b, 0x6d, 0x99, 0x68, 0x9d, 0x12, 0x35, 0x8e, 0xec, 0xa0, 0x4b, 0x14, 0x12, 0x36,
            0xfa, 0x81,
        ]; // base64 "W22ZaJ0SNY7soEsUEjb6gQ=="
        let cred = ScramCredential::derive(Mechanism::Sha256, b"pencil", &salt, 4096);
        cred.check().unwrap();
        let auth = b"n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        // p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=
        let proof = [
            0x74, 0x7c, 0xdb, 0x65, 0xaa, 0x56, 0x22, 0x4e, 0x23, 0x52, 0x13, 0x7e, 0x52, 0xd7,
            0xbd, 0xca, 0xd6, 0xa0, 0xf7, 0x38, 0xdf, 0x30, 0x78, 0x2c, 0xaa, 0x69, 0xa2, 0xcf,
            0xb0, 0x27, 0x75, 0x54,
        ];
        let server = cred.verify_proof(auth, &proof).expect("the RFC's proof");
        // v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=
        let expected = [
            0xea, 0xba, 0xe2, 0x4d, 0x10, 0x62, 0xdb, 0x75, 0xa9, 0x45, 0x1f, 0xf0, 0xb6, 0xea,
            0x7e, 0x98, 0xc8, 0x54, 0x65, 0x49, 0xff, 0x74, 0x1e, 0x67, 0x2d, 0x32, 0x51, 0xb2,
            0x39, 0x7d, 0xe4, 0x6e,
        ];
        assert_eq!(server, expected);
        let mut bad = proof;
        bad[0] ^= 1;
        assert!(cred.verify_proof(auth, &bad).is_none());
        assert!(cred.verify_password(b"pencil"));
        assert!(!cred.verify_password(b"pencil "));
    }

    #[test]
    fn bad_credentials_are_refused_naming_why() {
        let good = ScramCredential::derive(Mechanism::Sha512, b"pw", &[7; 16], 4096);
        assert_eq!(good.check(), Ok(Mechanism::Sha512));
        let mut c = good.clone();
        c.iterations = 100;
        assert!(c.check().unwrap_err().contains("100 iterations"));
        let mut c = good.clone();
        c.mechanism = "SCRAM-SHA-1".into();
        assert!(c.check().unwrap_err().contains("SCRAM-SHA-1"));
        let mut c = good.clone();
        c.stored_key.pop();
        assert!(c.check().unwrap_err().contains("64 bytes"));
        let mut c = good;
        c.salt = vec![1; 2];
        assert!(c.check().unwrap_err().contains("salt of 2 bytes"));
        assert!(!c.verify_password(b"pw"));
    }
}
