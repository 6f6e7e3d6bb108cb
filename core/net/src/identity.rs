//! Who is on the other end of a connection: the identity a verified TLS
//! certificate names.
//!
//! A certificate issued to a broker carries the URI subject alternative name
//! `urn:rill:broker:<id>` ([`broker_uri`]): its holder is the broker principal
//! `<id>`. Any other certificate names a client principal, its subject's common
//! name. The mark is trusted because the certificate was verified against the
//! CA the broker trusts (rustls did that during the handshake); this module
//! only reads certificates that were verified.
//!
//! Invariants:
//! - A certificate with a broker mark is a broker, never a client, whatever its
//!   common name; a certificate with two different broker marks, an unparsable
//!   mark or no common name names nobody ([`identity_of`] is `None`), so the
//!   connection is treated as anonymous and refused where a principal is
//!   needed.
//! - Principal names are 1 to [`PRINCIPAL_NAME_MAX`] characters of
//!   `A-Z a-z 0-9 . _ - @`, so they can be shown, stored and compared as they are.

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

use crate::error::NetError;

/// The prefix of the URI that marks a broker's certificate.
pub const BROKER_URI_PREFIX: &str = "urn:rill:broker:";

/// Longest principal name.
pub const PRINCIPAL_NAME_MAX: usize = 64;

/// The identity a verified certificate names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerIdentity {
    /// A broker of the cluster, by id.
    Broker(i32),
    /// A client principal: the certificate's common name.
    Named(String),
}

/// The URI that marks broker `id`'s certificate.
pub fn broker_uri(id: i32) -> String {
    format!("{BROKER_URI_PREFIX}{id}")
}

/// Checks that `name` can be a principal's name.
pub fn check_principal_name(name: &str) -> Result<(), NetError> {
    let ok = !name.is_empty()
        && name.len() <= PRINCIPAL_NAME_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if ok {
        Ok(())
    } else {
        Err(NetError::InvalidPrincipalName {
            name: name.to_string(),
        })
    }
}

/// The identity a (verified) end-entity certificate names; `None` if it names
/// nobody usable (see the module invariants).
pub fn identity_of(cert: &CertificateDer<'_>) -> Option<PeerIdentity> {
    let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(cert.as_ref()).ok()?;
    let mut broker = None;
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name
                && let Some(id) = uri.strip_prefix(BROKER_URI_PREFIX)
            {
                let id: i32 = id.parse().ok().filter(|id| *id >= 0)?;
                if broker.is_some_and(|b| b != id) {
                    return None;
                }
                broker = Some(id);
            }
        }
    }
    if let Some(id) = broker {
        return Some(PeerIdentity::Broker(id));
    }
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?;
    check_principal_name(cn).ok()?;
    Some(PeerIdentity::Named(cn.to_string()))
}

/// The identity of a connection's peer: the first certificate it presented
/// (verified in the handshake), if any.
pub fn peer_identity(conn: &quinn::Connection) -> Option<PeerIdentity> {
    let any = conn.peer_identity()?;
    let chain = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    identity_of(chain.first()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev_ca::ensure_dev_ca;

    #[test]
    fn broker_and_client_certificates_name_their_holders() {
        let home = tempfile::tempdir().unwrap();
        let ca = ensure_dev_ca(home.path()).unwrap();
        let (chain, _) = ca.issue_broker_cert(7, &["b7.example".into()]).unwrap();
        assert_eq!(identity_of(&chain[0]), Some(PeerIdentity::Broker(7)));
        let (chain, _) = ca.issue_client_cert("alice").unwrap();
        assert_eq!(
            identity_of(&chain[0]),
            Some(PeerIdentity::Named("alice".into()))
        );
        let (chain, _) = ca.issue_client_cert("svc.orders@prod").unwrap();
        assert_eq!(
            identity_of(&chain[0]),
            Some(PeerIdentity::Named("svc.orders@prod".into()))
        );
        // A server-only certificate has no broker mark, and its common name
        // ("Rill broker") is no principal name: it names nobody.
        let (chain, _) = ca.issue_server_cert(&[]).unwrap();
        assert_eq!(identity_of(&chain[0]), None);
    }

    #[test]
    fn principal_names_are_checked() {
        for good in ["a", "alice", "svc-1.orders_x@corp", &"x".repeat(64)] {
            check_principal_name(good).unwrap();
        }
        for bad in [
            "",
            "has space",
            "semi;colon",
            "slash/x",
            &"x".repeat(65),
            "é",
        ] {
            let e = check_principal_name(bad).unwrap_err().to_string();
            assert!(e.contains("principal name"), "{e}");
        }
        let home = tempfile::tempdir().unwrap();
        let ca = ensure_dev_ca(home.path()).unwrap();
        assert!(ca.issue_client_cert("bad name").is_err());
    }

    #[test]
    fn garbage_names_nobody() {
        assert_eq!(identity_of(&CertificateDer::from(vec![0u8; 10])), None);
    }
}
