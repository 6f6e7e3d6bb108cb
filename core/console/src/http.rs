//! The HTTP side: accept loop, routing, JSON and error responses, the
//! Server-Sent Events body.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch};

use crate::session::{self, Who, require};
use crate::{REQUEST_TIMEOUT, State, api, assets};
use rill_client::{AclOperation, AclResource};

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Largest request body accepted (the POSTs carry a few fields of JSON).
const BODY_BYTES_MAX: usize = 64 * 1024;

/// Accepts connections until `stop` turns true.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "console: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(req, state).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "console connection ended");
                    }
                }
                _ = stop.changed() => {}
            }
        });
    }
}

/// An API failure: a status and a message for the page.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

pub(crate) type ApiResult = Result<serde_json::Value, ApiError>;

/// The query string's parameters (later ones win).
pub(crate) fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// Why a request is refused before routing, if it is: on a loopback console a
/// Host that is not loopback (a DNS-rebinding page); for a change (any method
/// but GET and HEAD) a body that is not JSON or an Origin other than the
/// console's (another site's form or script).
pub(crate) fn request_refusal(
    method: &Method,
    headers: &hyper::HeaderMap,
    loopback: bool,
) -> Option<String> {
    let value = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let host = value(header::HOST).unwrap_or("");
    if loopback && !is_loopback_host(host) {
        return Some(format!(
            "this console listens on loopback and answers only requests for it (Host {host:?}); \
             open it as http://127.0.0.1:PORT or http://localhost:PORT"
        ));
    }
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    if !value(header::CONTENT_TYPE).is_some_and(|t| t.starts_with("application/json")) {
        return Some("a change needs a JSON body (Content-Type: application/json)".into());
    }
    if let Some(origin) = value(header::ORIGIN) {
        let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
        if !origin_host.eq_ignore_ascii_case(host) {
            return Some(format!(
                "a change must come from the console's own page, not from {origin}"
            ));
        }
    }
    None
}

/// Whether `host` (a Host header, `name[:port]`) names loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

async fn route(req: Request<Incoming>, state: Arc<State>) -> Response<Body> {
    if let Some(why) = request_refusal(req.method(), req.headers(), state.loopback) {
        return error_response(&ApiError::new(StatusCode::FORBIDDEN, why));
    }
    let path = req.uri().path().to_string();
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(|s| {
            url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = req.method().clone();
    if segs.first() != Some(&"api") {
        return match (method, segs.as_slice()) {
            (Method::GET, [""] | ["index.html"]) => {
                asset(assets::INDEX_HTML, "text/html; charset=utf-8")
            }
            (Method::GET, ["app.js"]) => asset(assets::APP_JS, "text/javascript; charset=utf-8"),
            (Method::GET, ["app.css"]) => asset(assets::APP_CSS, "text/css; charset=utf-8"),
            (Method::GET, ["favicon.ico"]) => empty(StatusCode::NO_CONTENT),
            _ => error_response(&ApiError::not_found(format!("no page at {path}"))),
        };
    }
    // Signing in and out, and who is signed in: the only API calls made
    // without a principal.
    match (&method, segs.as_slice()) {
        (&Method::GET, ["api", "session"]) => return session_info(&state, req.headers()),
        (&Method::POST, ["api", "session"]) => return sign_in(req, &state).await,
        (&Method::POST, ["api", "signout"]) => return sign_out(),
        _ => {}
    }
    let who = match session::who(state.users.as_ref(), req.headers()) {
        Ok(w) => w,
        Err(e) => return error_response(&e),
    };
    // The live tail streams; it is bounded by the connection, not by a timeout.
    if let (&Method::GET, ["api", "topics", topic, "tail"]) = (&method, segs.as_slice()) {
        let allowed = tokio::time::timeout(
            REQUEST_TIMEOUT,
            require(&state, &who, vec![(AclOperation::Read, topic_res(topic))]),
        )
        .await
        .unwrap_or_else(|_| Err(timed_out()));
        if let Err(e) = allowed {
            return error_response(&e);
        }
        return match api::tail(state, topic, who).await {
            Ok(rx) => sse(rx),
            Err(e) => error_response(&e),
        };
    }
    let result = tokio::time::timeout(REQUEST_TIMEOUT, api_call(req, &segs, state, who))
        .await
        .unwrap_or_else(|_| Err(timed_out()));
    match result {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => error_response(&e),
    }
}

fn timed_out() -> ApiError {
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        format!(
            "the cluster did not answer within {} s",
            REQUEST_TIMEOUT.as_secs()
        ),
    )
}

fn topic_res(name: &str) -> AclResource {
    AclResource::Topic(name.to_string())
}

/// The string field `key` of a request body ("" when missing: the handler
/// names what is wrong with it).
fn field<'a>(body: &'a serde_json::Value, key: &str) -> &'a str {
    body.get(key).and_then(|v| v.as_str()).unwrap_or("")
}

/// Routes an API request made by `who`: each route first checks what the
/// broker would check for the requests it makes (the ACLs of `who`), lists
/// leave out what `who` may not describe.
async fn api_call(req: Request<Incoming>, segs: &[&str], state: Arc<State>, who: Who) -> ApiResult {
    use AclOperation::{Alter, Create, Describe, Read};
    let q = query(&req);
    let method = req.method().clone();
    let group_res = |g: &str| AclResource::Group(g.to_string());
    let transform_res = |t: &str| AclResource::Transform(t.to_string());
    match (method, segs) {
        (Method::GET, ["api", "cluster"]) => api::cluster(&state).await,
        (Method::GET, ["api", "metrics"]) => {
            require(&state, &who, vec![(Describe, AclResource::Cluster)]).await?;
            api::metrics(&state)
        }
        (Method::GET, ["api", "topics"]) => api::topics(&state, &q, &who).await,
        (Method::POST, ["api", "topics"]) => {
            let body = read_json(req).await?;
            let name = field(&body, "name").trim();
            if !name.is_empty() {
                require(&state, &who, vec![(Create, topic_res(name))]).await?;
            }
            api::create_topic(&state, &body).await
        }
        (Method::POST, ["api", "topics", topic, "configs"]) => {
            require(&state, &who, vec![(Alter, topic_res(topic))]).await?;
            let body = read_json(req).await?;
            api::alter_configs(&state, topic, &body).await
        }
        (Method::GET, ["api", "topics", topic]) => {
            require(&state, &who, vec![(Describe, topic_res(topic))]).await?;
            api::topic(&state, topic, &q).await
        }
        (Method::GET, ["api", "topics", topic, "records"]) => {
            require(&state, &who, vec![(Read, topic_res(topic))]).await?;
            api::records(&state, topic, &q).await
        }
        (Method::GET, ["api", "groups"]) => api::groups(&state, &who).await,
        (Method::GET, ["api", "groups", group]) => {
            require(&state, &who, vec![(Describe, group_res(group))]).await?;
            api::group(&state, group, &who).await
        }
        (Method::POST, ["api", "groups", group, "reset-offsets"]) => {
            let body = read_json(req).await?;
            // What OffsetCommit needs: read on the group and on the topic.
            let mut checks = vec![(Read, group_res(group))];
            let topic = field(&body, "topic").trim();
            if !topic.is_empty() {
                checks.push((Read, topic_res(topic)));
            }
            require(&state, &who, checks).await?;
            api::reset_offsets(&state, group, &body).await
        }
        (Method::GET, ["api", "transforms"]) => api::transforms(&state, &who).await,
        (Method::GET, ["api", "transforms", name]) => {
            require(&state, &who, vec![(Describe, transform_res(name))]).await?;
            api::transform(&state, name).await
        }
        (Method::POST, ["api", "transforms", name, action @ ("pause" | "resume")]) => {
            // The rest of what TransformWrite needs (read on the inputs, write
            // on the outputs) is checked once the deployment is loaded.
            require(&state, &who, vec![(Alter, transform_res(name))]).await?;
            api::set_transform_state(&state, name, action == &"pause", &who).await
        }
        (m, _) => Err(ApiError::not_found(format!(
            "no API {m} {}",
            segs.join("/")
        ))),
    }
}

/// `GET /api/session`: whether the console signs users in, and who is.
fn session_info(state: &State, headers: &hyper::HeaderMap) -> Response<Body> {
    let body = match (&state.users, session::who(state.users.as_ref(), headers)) {
        (None, _) => serde_json::json!({ "auth": false, "principal": null }),
        (Some(_), Ok(who)) => serde_json::json!({ "auth": true, "principal": who.stamp() }),
        (Some(_), Err(e)) => {
            serde_json::json!({ "auth": true, "principal": null, "why": e.message })
        }
    };
    json(StatusCode::OK, &body)
}

/// `POST /api/session` with `{"token": "..."}`: checks the token and keeps it
/// in the browser as an HttpOnly, SameSite=Strict cookie.
async fn sign_in(req: Request<Incoming>, state: &State) -> Response<Body> {
    if state.users.is_none() {
        return error_response(&ApiError::bad_request(
            "this console does not sign users in: its brokers run with --auth none",
        ));
    }
    let body = match read_json(req).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let token = field(&body, "token").trim().to_string();
    let mut headers = hyper::HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        match format!("Bearer {token}").parse() {
            Ok(v) => v,
            Err(_) => {
                return error_response(&ApiError::bad_request(
                    "the token holds characters no token has",
                ));
            }
        },
    );
    let who = match session::who(state.users.as_ref(), &headers) {
        Ok(w) => w,
        Err(e) => return error_response(&e),
    };
    let mut r = json(
        StatusCode::OK,
        &serde_json::json!({ "auth": true, "principal": who.stamp() }),
    );
    let cookie = format!(
        "{}={token}; Path=/; HttpOnly; SameSite=Strict",
        session::COOKIE
    );
    match cookie.parse() {
        Ok(v) => {
            r.headers_mut().insert(header::SET_COOKIE, v);
            r
        }
        Err(_) => error_response(&ApiError::bad_request(
            "the token holds characters no token has",
        )),
    }
}

/// `POST /api/signout`: forgets the browser's token.
fn sign_out() -> Response<Body> {
    let mut r = json(StatusCode::OK, &serde_json::json!({ "principal": null }));
    let cookie = format!(
        "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
        session::COOKIE
    );
    r.headers_mut()
        .insert(header::SET_COOKIE, cookie.parse().expect("a valid cookie"));
    r
}

async fn read_json(req: Request<Incoming>) -> Result<serde_json::Value, ApiError> {
    let bytes = Limited::new(req.into_body(), BODY_BYTES_MAX)
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

fn asset(body: &'static str, content_type: &str) -> Response<Body> {
    let mut r = Response::new(full(body));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, content_type.parse().unwrap());
    r.headers_mut()
        .insert(header::CACHE_CONTROL, "no-cache".parse().unwrap());
    r
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(serde_json::to_vec(v).expect("JSON encodes")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    r.headers_mut()
        .insert(header::CACHE_CONTROL, "no-store".parse().unwrap());
    r
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    json(e.status, &serde_json::json!({ "error": e.message }))
}

/// A `text/event-stream` response whose events come from `rx`.
fn sse(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let mut r = Response::new(ChannelBody(rx).boxed());
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    h.insert(header::CACHE_CONTROL, "no-store".parse().unwrap());
    r
}

/// A body that streams what a channel receives (ends when the sender drops).
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> hyper::HeaderMap {
        let mut h = hyper::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_loopback_console_answers_only_loopback_hosts() {
        for host in [
            "127.0.0.1:9644",
            "localhost:9644",
            "[::1]:9644",
            "LOCALHOST",
        ] {
            let h = headers(&[("host", host)]);
            assert_eq!(request_refusal(&Method::GET, &h, true), None, "{host}");
        }
        let h = headers(&[("host", "evil.example:9644")]);
        assert!(request_refusal(&Method::GET, &h, true).is_some());
        // Listening elsewhere (auth on, or allowed remote): any name.
        assert_eq!(request_refusal(&Method::GET, &h, false), None);
    }

    #[test]
    fn changes_are_json_from_the_consoles_own_origin() {
        let ok = headers(&[
            ("host", "127.0.0.1:9644"),
            ("content-type", "application/json"),
            ("origin", "http://127.0.0.1:9644"),
        ]);
        assert_eq!(request_refusal(&Method::POST, &ok, true), None);
        let no_origin = headers(&[
            ("host", "127.0.0.1:9644"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(request_refusal(&Method::POST, &no_origin, true), None);
        let form = headers(&[("host", "127.0.0.1:9644"), ("content-type", "text/plain")]);
        assert!(request_refusal(&Method::POST, &form, true).is_some());
        let other = headers(&[
            ("host", "127.0.0.1:9644"),
            ("content-type", "application/json"),
            ("origin", "https://evil.example"),
        ]);
        let why = request_refusal(&Method::POST, &other, true).unwrap();
        assert!(why.contains("evil.example"), "{why}");
    }
}
