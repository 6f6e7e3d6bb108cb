//! SASL on the Kafka listener (`[kafka] sasl_mechanisms`): SaslHandshake
//! (v0-1, both advertised: librdkafka 2.0 looks for v0 in ApiVersions before
//! it authenticates, then speaks v1; a client that really speaks v0 sends raw
//! tokens outside Kafka framing and is closed as malformed) and
//! SaslAuthenticate (v0-2) with PLAIN (RFC 4616) and
//! SCRAM-SHA-256/512 (RFC 5802, 7677, as Kafka speaks them) against the SCRAM
//! credentials in the metadata image (`rill user add`). The authenticated user
//! is the connection's principal (`Principal::User`), under the same ACLs as a
//! certificate's common name.
//!
//! Invariants:
//! - With mechanisms enabled, a connection serves nothing but ApiVersions,
//!   SaslHandshake and SaslAuthenticate until it authenticated
//!   ([`State::authenticated`]); any other request closes it (Kafka's
//!   ILLEGAL_SASL_STATE).
//! - A failed authentication is answered SASL_AUTHENTICATION_FAILED and the
//!   connection closed; an unknown user fails exactly as a wrong password
//!   does (SCRAM runs the exchange with a made-up credential), so the answer
//!   does not tell which.
//! - One exchange per connection (no re-authentication: session lifetime 0).

use crate::Closed;
use crate::apis::sb;
use crate::codes::kafka;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use kafka_protocol::messages::{self as km, ApiKey};
use kafka_protocol::protocol::Decodable;
use rand::RngCore;
use rill_broker::front_door::{Caller, Principal};
use rill_proto::scram::{ITERATIONS_MIN, Mechanism, SALT_LEN, ScramCredential};
use std::sync::Arc;

/// Error codes of this module's answers.
pub const ILLEGAL_SASL_STATE: i16 = 34;
pub const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// Longest SASL token accepted (a SCRAM or PLAIN message is far shorter).
const TOKEN_BYTES_MAX: usize = 4096;

/// Where a connection is in its SASL exchange.
#[derive(Debug, Default)]
pub(crate) enum State {
    /// The listener has no SASL: nothing to do.
    #[default]
    Off,
    /// Waiting for SaslHandshake.
    Start,
    /// The client chose a mechanism; its first SaslAuthenticate is next.
    Chose(Chosen),
    /// SCRAM: the server-first message was sent.
    ScramSent(ScramExchange),
    /// Authenticated.
    Done,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Chosen {
    Plain,
    Scram(Mechanism),
}

#[derive(Debug)]
pub(crate) struct ScramExchange {
    mechanism: Mechanism,
    user: String,
    /// `None` for an unknown user: the exchange fails at its end.
    credential: Option<ScramCredential>,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl State {
    /// The state a new connection starts in.
    pub fn new(enabled: bool) -> State {
        if enabled { State::Start } else { State::Off }
    }

    /// Whether requests other than the SASL ones may be served.
    pub fn authenticated(&self) -> bool {
        matches!(self, State::Off | State::Done)
    }
}

/// Serves a SaslHandshake or SaslAuthenticate; may replace the connection's
/// caller with the authenticated principal. `Ok` with a closing reason in
/// `close_after` when the answer is to be sent and the connection closed.
pub(crate) async fn serve(
    shared: &crate::Shared,
    state: &mut State,
    caller: &mut Arc<Caller>,
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    mut body: Bytes,
) -> Result<(Bytes, Option<String>), Closed> {
    let enabled = &shared.front.config().kafka.sasl_mechanisms;
    macro_rules! encode {
        ($response:expr) => {
            crate::encode_response(key, version, correlation_id, &$response)
        };
    }
    if key == ApiKey::SaslHandshake {
        let r = km::SaslHandshakeRequest::decode(&mut body, version)
            .map_err(|e| Closed::Because(format!("malformed SaslHandshake v{version}: {e}")))?;
        let mechanism = r.mechanism.to_string();
        let offered: Vec<_> = enabled.iter().map(|m| sb(m.clone())).collect();
        let response = km::SaslHandshakeResponse::default().with_mechanisms(offered);
        let chosen = match mechanism.as_str() {
            m if !enabled.iter().any(|e| e == m) => None,
            "PLAIN" => Some(Chosen::Plain),
            m => Mechanism::from_name(m).map(Chosen::Scram),
        };
        return match (&*state, chosen) {
            (State::Start, Some(c)) => {
                *state = State::Chose(c);
                Ok((encode!(response)?, None))
            }
            (State::Start | State::Off, None) => {
                tracing::info!(peer = %caller.peer, %mechanism, ?enabled, "Kafka client asked for a SASL mechanism this listener does not offer");
                let response = response.with_error_code(kafka::UNSUPPORTED_SASL_MECHANISM);
                Ok((encode!(response)?, None))
            }
            _ => {
                let response = response.with_error_code(ILLEGAL_SASL_STATE);
                Ok((
                    encode!(response)?,
                    Some("SaslHandshake again after it was done".into()),
                ))
            }
        };
    }
    let r = km::SaslAuthenticateRequest::decode(&mut body, version)
        .map_err(|e| Closed::Because(format!("malformed SaslAuthenticate v{version}: {e}")))?;
    let fail = |code: i16, message: String| -> Result<(Bytes, Option<String>), Closed> {
        let response = km::SaslAuthenticateResponse::default()
            .with_error_code(code)
            .with_error_message(Some(sb(message.clone())));
        Ok((encode!(response)?, Some(message)))
    };
    if r.auth_bytes.len() > TOKEN_BYTES_MAX {
        return fail(
            SASL_AUTHENTICATION_FAILED,
            format!("a SASL token of {} bytes is too long", r.auth_bytes.len()),
        );
    }
    let token = r.auth_bytes.to_vec();
    let failed = |mechanism: &str| {
        format!(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
        )
    };
    match std::mem::take(state) {
        State::Chose(Chosen::Plain) => {
            let Some((user, password)) = parse_plain(&token) else {
                return fail(
                    SASL_AUTHENTICATION_FAILED,
                    "a malformed SASL PLAIN message".into(),
                );
            };
            let creds = shared.front.scram_credentials(&user);
            let secret = password.clone();
            // PBKDF2 takes milliseconds: off the async workers.
            let ok = tokio::task::spawn_blocking(move || {
                creds.iter().any(|c| c.verify_password(secret.as_bytes()))
            })
            .await
            .unwrap_or(false);
            if !ok {
                tracing::info!(peer = %caller.peer, %user, "Kafka SASL PLAIN authentication failed");
                return fail(SASL_AUTHENTICATION_FAILED, failed("PLAIN"));
            }
            *state = State::Done;
            *caller = authenticated(caller, user);
            let response = km::SaslAuthenticateResponse::default();
            Ok((encode!(response)?, None))
        }
        State::Chose(Chosen::Scram(mechanism)) => {
            let Some((user, client_first_bare, client_nonce)) = parse_client_first(&token) else {
                return fail(
                    SASL_AUTHENTICATION_FAILED,
                    format!("a malformed {} client-first message", mechanism.name()),
                );
            };
            let credential = shared
                .front
                .scram_credentials(&user)
                .into_iter()
                .find(|c| c.mechanism == mechanism.name());
            let (salt, iterations) = match &credential {
                Some(c) => (c.salt.clone(), c.iterations),
                None => {
                    // A made-up salt, so an unknown user looks like a known one.
                    let mut salt = vec![0u8; SALT_LEN];
                    rand::rng().fill_bytes(&mut salt);
                    (salt, ITERATIONS_MIN.max(8192))
                }
            };
            let mut extra = [0u8; 18];
            rand::rng().fill_bytes(&mut extra);
            let nonce = format!("{client_nonce}{}", B64.encode(extra));
            let server_first = format!("r={nonce},s={},i={iterations}", B64.encode(&salt));
            let response = km::SaslAuthenticateResponse::default()
                .with_auth_bytes(Bytes::from(server_first.clone().into_bytes()));
            *state = State::ScramSent(ScramExchange {
                mechanism,
                user,
                credential,
                client_first_bare,
                server_first,
                nonce,
            });
            Ok((encode!(response)?, None))
        }
        State::ScramSent(x) => {
            let name = x.mechanism.name();
            let Some((without_proof, proof)) = parse_client_final(&token, &x.nonce) else {
                return fail(
                    SASL_AUTHENTICATION_FAILED,
                    format!("a malformed {name} client-final message"),
                );
            };
            let auth_message =
                format!("{},{},{without_proof}", x.client_first_bare, x.server_first);
            let signature = x
                .credential
                .as_ref()
                .and_then(|c| c.verify_proof(auth_message.as_bytes(), &proof));
            let Some(signature) = signature else {
                tracing::info!(peer = %caller.peer, user = %x.user, mechanism = name, "Kafka SASL SCRAM authentication failed");
                return fail(SASL_AUTHENTICATION_FAILED, failed(name));
            };
            *state = State::Done;
            *caller = authenticated(caller, x.user);
            let server_final = format!("v={}", B64.encode(signature));
            let response = km::SaslAuthenticateResponse::default()
                .with_auth_bytes(Bytes::from(server_final.into_bytes()));
            Ok((encode!(response)?, None))
        }
        other => {
            let message = match other {
                State::Off => "SaslAuthenticate, but this listener has no SASL mechanisms".into(),
                State::Done => "SaslAuthenticate after authentication succeeded".into(),
                _ => "SaslAuthenticate before SaslHandshake".to_string(),
            };
            *state = other;
            fail(ILLEGAL_SASL_STATE, message)
        }
    }
}

fn authenticated(caller: &Caller, user: String) -> Arc<Caller> {
    tracing::debug!(peer = %caller.peer, %user, "Kafka client authenticated with SASL");
    Arc::new(Caller {
        principal: Principal::User(user),
        peer: caller.peer,
    })
}

/// PLAIN: `[authzid] NUL authcid NUL passwd`; an authzid must be the
/// authcid. (user, password).
fn parse_plain(token: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(token).ok()?;
    let mut parts = text.split('\0');
    let (authzid, user, password) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || user.is_empty() || (!authzid.is_empty() && authzid != user) {
        return None;
    }
    Some((user.to_string(), password.to_string()))
}

/// SCRAM client-first: `gs2-header client-first-bare`, the header `n,,`
/// (no channel binding; an authzid is ignored), the bare part
/// `n=USER,r=NONCE[,ext]`. (user, client-first-bare, client nonce).
fn parse_client_first(token: &[u8]) -> Option<(String, String, String)> {
    let text = std::str::from_utf8(token).ok()?;
    let rest = text.strip_prefix("n,")?;
    let (_authzid, bare) = rest.split_once(',')?;
    let mut user = None;
    let mut nonce = None;
    for attr in bare.split(',') {
        match attr.split_once('=')? {
            ("n", v) => user = Some(v.replace("=2C", ",").replace("=3D", "=")),
            ("r", v) if !v.is_empty() && v.chars().all(|c| c.is_ascii_graphic() && c != ',') => {
                nonce = Some(v.to_string())
            }
            // Kafka's delegation tokens (tokenauth=true) are not offered.
            ("tokenauth", _) => return None,
            _ => {}
        }
    }
    Some((user.filter(|u| !u.is_empty())?, bare.to_string(), nonce?))
}

/// SCRAM client-final: `c=biws,r=NONCE,p=PROOF` with the nonce the server
/// sent. (the message without `,p=...`, the proof). As Kafka's
/// `ScramSaslServer`, a nonce that ends with the server's is taken:
/// librdkafka 2.0 (Debian's kcat) sends the client nonce twice before the
/// server's part; the proof covers the message as sent, so it still proves
/// the password.
fn parse_client_final(token: &[u8], nonce: &str) -> Option<(String, Vec<u8>)> {
    let text = std::str::from_utf8(token).ok()?;
    let (without_proof, proof) = text.rsplit_once(",p=")?;
    let mut binding_ok = false;
    let mut nonce_ok = false;
    for attr in without_proof.split(',') {
        match attr.split_once('=')? {
            // base64("n,,"): no channel binding.
            ("c", v) => binding_ok = v == "biws",
            ("r", v) => nonce_ok = v.ends_with(nonce),
            _ => {}
        }
    }
    if !binding_ok || !nonce_ok {
        return None;
    }
    Some((without_proof.to_string(), B64.decode(proof).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_messages_parse_and_a_foreign_authzid_is_refused() {
        assert_eq!(
            parse_plain(b"\0alice\0pw"),
            Some(("alice".into(), "pw".into()))
        );
        assert_eq!(
            parse_plain(b"alice\0alice\0pw"),
            Some(("alice".into(), "pw".into()))
        );
        assert_eq!(parse_plain(b"bob\0alice\0pw"), None);
        assert_eq!(parse_plain(b"\0\0pw"), None);
        assert_eq!(parse_plain(b"alice pw"), None);
    }

    /// RFC 7677's exchange, as the parsers and the credential check see it.
    #[test]
    fn the_rfc_7677_exchange_verifies() {
        let (user, bare, cnonce) = parse_client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
        assert_eq!(
            (user.as_str(), cnonce.as_str()),
            ("user", "rOprNGfwEbeRWgbNEkqO")
        );
        let nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let server_first = format!("r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096");
        let client_final =
            format!("c=biws,r={nonce},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
        let (without, proof) = parse_client_final(client_final.as_bytes(), nonce).unwrap();
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = ScramCredential::derive(Mechanism::Sha256, b"pencil", &salt, 4096);
        let auth = format!("{bare},{server_first},{without}");
        let v = cred.verify_proof(auth.as_bytes(), &proof).unwrap();
        assert_eq!(
            B64.encode(v),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        // Another nonce, or channel binding, is refused.
        assert!(parse_client_final(client_final.as_bytes(), "other").is_none());
        let short = client_final.replace(nonce, &nonce[..nonce.len() - 1]);
        assert!(parse_client_final(short.as_bytes(), nonce).is_none());
        // librdkafka 2.0's form (the client nonce again before the server's
        // nonce) is taken, as Kafka takes it.
        let doubled = client_final.replace(nonce, &format!("rOprNGfwEbeRWgbNEkqO{nonce}"));
        assert!(parse_client_final(doubled.as_bytes(), nonce).is_some());
        let bound = client_final.replace("c=biws", "c=cD10bHMtdW5pcXVlLCw=");
        assert!(parse_client_final(bound.as_bytes(), nonce).is_none());
        assert!(parse_client_first(b"p=tls-unique,,n=user,r=x").is_none());
        assert!(parse_client_first(b"n,,n=user,r=x,tokenauth=true").is_none());
        let (user, _, _) = parse_client_first(b"n,,n=a=3Db=2Cc,r=x").unwrap();
        assert_eq!(user, "a=b,c");
    }
}
