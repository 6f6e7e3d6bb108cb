//! Loopback tests of rill-net: a real QUIC server and client on 127.0.0.1, with
//! development CAs in temp directories (never the real ~/.rill). Every test is
//! bounded by a timeout. One test runs on ::1: a host without IPv6 loopback
//! fails it, unless `RILL_TEST_SKIP=ipv6` (README.md; build.rs) marks it ignored.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use rill_net::{
    ClientTls, NetError, ServerTls, TransportLimits, call, client_endpoint, client_endpoint_for,
    connect, connect_named, ensure_dev_ca, parse_frame_header, read_frame, read_frame_body,
    read_frame_header_bytes, server_endpoint, write_frame,
};

const TEST_TIMEOUT: Duration = Duration::from_secs(20);
/// api_key of the error frame the test server answers with when it refuses a request.
const REFUSED_API_KEY: u16 = u16::MAX;

fn localhost() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

/// Starts an echo server: each request frame comes back as the response; a frame
/// `read_frame` refuses is answered with `REFUSED_API_KEY` and the error text.
fn start_echo_server(tls: &ServerTls, max_frame_bytes: u32) -> quinn::Endpoint {
    start_echo_server_with(tls, max_frame_bytes, &TransportLimits::default())
}

fn start_echo_server_with(
    tls: &ServerTls,
    max_frame_bytes: u32,
    limits: &TransportLimits,
) -> quinn::Endpoint {
    let endpoint = server_endpoint(localhost(), tls, limits).unwrap();
    let accepting = endpoint.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    tokio::spawn(async move {
                        match read_frame(&mut recv, max_frame_bytes).await {
                            Ok(f) => {
                                write_frame(
                                    &mut send,
                                    f.api_key,
                                    f.api_version,
                                    &f.meta,
                                    &[f.payload],
                                )
                                .await
                                .unwrap();
                            }
                            Err(e) => {
                                write_frame(
                                    &mut send,
                                    REFUSED_API_KEY,
                                    0,
                                    e.to_string().as_bytes(),
                                    &[],
                                )
                                .await
                                .unwrap();
                            }
                        }
                        send.finish().unwrap();
                        // Keep the stream until the peer has read the answer.
                        let _ = send.stopped().await;
                    });
                }
            });
        }
    });
    endpoint
}

fn dev(home: &Path) -> (ServerTls, ClientTls) {
    (
        ServerTls::Dev {
            home: home.to_path_buf(),
        },
        ClientTls::Dev {
            home: home.to_path_buf(),
        },
    )
}

fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i * 7 % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn a_frame_with_meta_and_one_mib_payload_round_trips() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let server = start_echo_server(&server_tls, 4 << 20);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.local_addr().unwrap().port()));

        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let conn = connect(&client, addr).await.unwrap();
        assert_eq!(
            conn.handshake_data()
                .unwrap()
                .downcast::<quinn::crypto::rustls::HandshakeData>()
                .unwrap()
                .protocol
                .unwrap(),
            rill_net::ALPN
        );

        let payload = pattern(1 << 20);
        // Two chunks, to check they are sent back to back.
        let chunks = [payload.slice(..300_000), payload.slice(300_000..)];
        let response = call(&conn, 7, 3, b"meta: produce", &chunks, 4 << 20)
            .await
            .unwrap();
        assert_eq!((response.api_key, response.api_version), (7, 3));
        assert_eq!(&response.meta[..], b"meta: produce");
        assert_eq!(response.payload, payload);

        // An empty payload and empty meta are fine too.
        let response = call(&conn, 1, 0, b"", &[], 1024).await.unwrap();
        assert!(response.meta.is_empty() && response.payload.is_empty());
    })
    .await
    .unwrap();
}

/// Path MTU discovery climbs to the configured UDP payload bound where the path
/// carries it (loopback does), and never past it: the default bound reaches
/// 64 KiB packets on loopback, 8952 (a 9000-byte MTU) and 1452 (Ethernet) stop
/// there.
/// It stays there under bulk traffic (the batches of segmentation offload fit
/// the kernel's 64 KiB limit).
#[tokio::test]
async fn mtu_discovery_climbs_to_the_configured_udp_payload_bound() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        for bound in [
            rill_net::MTU_UPPER_BOUND_DEFAULT,
            8952u16,
            rill_net::MTU_ETHERNET,
        ] {
            let limits = TransportLimits {
                mtu_upper_bound: bound,
                ..TransportLimits::default()
            };
            let server = start_echo_server_with(&server_tls, 4 << 20, &limits);
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.local_addr().unwrap().port()));
            let client = client_endpoint(&client_tls, &limits).unwrap();
            let conn = connect(&client, addr).await.unwrap();
            // Discovery probes after the handshake, while there is traffic.
            let payload = pattern(64 << 10);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let mut mtu = conn.stats().path.current_mtu;
            while mtu < bound - 64 && tokio::time::Instant::now() < deadline {
                call(&conn, 7, 0, b"", std::slice::from_ref(&payload), 1 << 20)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                mtu = conn.stats().path.current_mtu;
            }
            println!("bound {bound}: path MTU {mtu}");
            assert!(
                mtu > bound - 64 && mtu <= bound,
                "bound {bound}: path MTU {mtu} after 10 s of traffic"
            );
            // Bulk traffic: full segmentation-offload batches of the large
            // packets. A batch the kernel refuses is lost whole, and losses of
            // large packets make quinn fall back to a 1,200-byte path MTU.
            let bulk = pattern(1 << 20);
            for _ in 0..4 {
                let calls: Vec<_> = (0..8)
                    .map(|_| {
                        let conn = conn.clone();
                        let bulk = bulk.clone();
                        tokio::spawn(async move {
                            call(&conn, 7, 0, b"", &[bulk], 2 << 20).await.unwrap()
                        })
                    })
                    .collect();
                for c in calls {
                    assert_eq!(c.await.unwrap().payload.len(), 1 << 20);
                }
            }
            let stats = conn.stats();
            println!(
                "bound {bound}: after 32 MiB each way, path MTU {}, lost packets {}",
                stats.path.current_mtu, stats.path.lost_packets
            );
            assert!(
                stats.path.current_mtu > bound - 64,
                "bound {bound}: path MTU fell to {} under bulk traffic ({} packets lost)",
                stats.path.current_mtu,
                stats.path.lost_packets
            );
            conn.close(0u32.into(), b"done");
            server.close(0u32.into(), b"done");
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_oversized_frame_is_refused_and_the_connection_keeps_serving() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let server = start_echo_server(&server_tls, 64 * 1024);
        let addr = server.local_addr().unwrap();
        let client = client_endpoint_for(addr, &client_tls, &TransportLimits::default()).unwrap();
        let conn = connect(&client, addr).await.unwrap();

        match call(&conn, 7, 1, b"big", &[pattern(1 << 20)], 1 << 20).await {
            Ok(refusal) => {
                assert_eq!(refusal.api_key, REFUSED_API_KEY);
                let text = String::from_utf8(refusal.meta.to_vec()).unwrap();
                assert!(
                    text.contains("larger than the limit of 65536 bytes"),
                    "{text}"
                );
            }
            // The broker may stop the stream before its answer is readable.
            Err(NetError::FrameRefused { code }) => {
                assert_eq!(code, rill_net::STREAM_FRAME_REFUSED);
            }
            Err(e) => panic!("unexpected error: {e}"),
        }

        // Same connection, next stream: served.
        let response = call(&conn, 7, 1, b"small", &[pattern(1000)], 1 << 20)
            .await
            .unwrap();
        assert_eq!(&response.meta[..], b"small");
        assert_eq!(response.payload, pattern(1000));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_reader_can_answer_a_refused_frame_with_its_api_key() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let server =
            server_endpoint(localhost(), &server_tls, &TransportLimits::default()).unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let conn = server.accept().await.unwrap().await.unwrap();
            let (mut send, mut recv) = conn.accept_bi().await.unwrap();
            // The three steps of read_frame.
            let head = read_frame_header_bytes(&mut recv).await.unwrap();
            let (key, version) = (
                u16::from_be_bytes([head[4], head[5]]),
                u16::from_be_bytes([head[6], head[7]]),
            );
            let err = parse_frame_header(&mut recv, &head, 1024).unwrap_err();
            assert!(matches!(err, NetError::FrameTooLarge { .. }), "{err}");
            write_frame(&mut send, key, version, err.to_string().as_bytes(), &[])
                .await
                .unwrap();
            send.finish().unwrap();
            let _ = send.stopped().await;
            // The connection still serves; the body step alone works too.
            let (mut send, mut recv) = conn.accept_bi().await.unwrap();
            let head = read_frame_header_bytes(&mut recv).await.unwrap();
            let header = parse_frame_header(&mut recv, &head, 1024).unwrap();
            let f = read_frame_body(&mut recv, &header).await.unwrap();
            write_frame(&mut send, f.api_key, f.api_version, &f.meta, &[f.payload])
                .await
                .unwrap();
            send.finish().unwrap();
            let _ = send.stopped().await;
        });
        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let conn = connect(&client, addr).await.unwrap();
        match call(&conn, 9, 4, b"big", &[pattern(100_000)], 1024).await {
            Ok(refusal) => {
                assert_eq!((refusal.api_key, refusal.api_version), (9, 4));
                let text = String::from_utf8(refusal.meta.to_vec()).unwrap();
                assert!(
                    text.contains("larger than the limit of 1024 bytes"),
                    "{text}"
                );
            }
            Err(NetError::FrameRefused { code }) => {
                assert_eq!(code, rill_net::STREAM_FRAME_REFUSED)
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        let response = call(&conn, 9, 4, b"m", &[pattern(100)], 1024)
            .await
            .unwrap();
        assert_eq!(response.payload, pattern(100));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn read_frame_reports_too_large_truncated_and_empty_streams() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let server = start_echo_server(&server_tls, 1 << 20);
        let addr = server.local_addr().unwrap();
        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let conn = connect(&client, addr).await.unwrap();

        // The client refuses a response larger than its limit.
        let err = call(&conn, 7, 1, b"m", &[pattern(10_000)], 1000)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                NetError::FrameTooLarge {
                    size: 10_009,
                    max: 1000
                }
            ),
            "{err}"
        );

        // A header announcing 100 body bytes, then only 10: truncated.
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let header = rill_proto::wire::FrameHeader::encode(7, 1, 0, 100);
        send.write_all(&header).await.unwrap();
        send.write_all(&[0u8; 10]).await.unwrap();
        send.finish().unwrap();
        let refusal = read_frame(&mut recv, 1 << 20).await.unwrap();
        let text = String::from_utf8(refusal.meta.to_vec()).unwrap();
        assert!(
            text.contains("truncated frame") && text.contains("after 10 of 100 bytes"),
            "{text}"
        );

        // A stream finished with no bytes at all.
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.finish().unwrap();
        let refusal = read_frame(&mut recv, 1 << 20).await.unwrap();
        let text = String::from_utf8(refusal.meta.to_vec()).unwrap();
        assert!(text.contains("without sending a frame"), "{text}");

        // meta_len beyond the frame: malformed.
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let mut header = rill_proto::wire::FrameHeader::encode(7, 1, 0, 4);
        header[8..12].copy_from_slice(&50u32.to_be_bytes());
        send.write_all(&header).await.unwrap();
        send.write_all(&[0u8; 4]).await.unwrap();
        send.finish().unwrap();
        let refusal = read_frame(&mut recv, 1 << 20).await.unwrap();
        let text = String::from_utf8(refusal.meta.to_vec()).unwrap();
        assert!(text.contains("malformed frame"), "{text}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_client_trusting_another_ca_fails_with_a_tls_error_naming_its_ca() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let broker_home = tempfile::tempdir().unwrap();
        let other_home = tempfile::tempdir().unwrap();
        ensure_dev_ca(other_home.path()).unwrap();
        let (server_tls, _) = dev(broker_home.path());
        let (_, client_tls) = dev(other_home.path());
        let server = start_echo_server(&server_tls, 1 << 20);
        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let err = connect(&client, server.local_addr().unwrap())
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, NetError::TlsHandshake { .. }), "{msg}");
        let expected = format!(
            "the broker's certificate is not signed by the CA at {}",
            other_home.path().join("ca.pem").display()
        );
        assert!(msg.contains(&expected), "{msg}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_name_the_certificate_does_not_carry_is_refused() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let server = start_echo_server(&server_tls, 1 << 20);
        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let addr = server.local_addr().unwrap();
        let err = connect_named(
            &client,
            addr,
            "broker.example.invalid",
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, NetError::TlsHandshake { .. }), "{err}");
        assert!(err.to_string().contains("broker.example.invalid"), "{err}");
        // The names it does carry work.
        connect_named(&client, addr, "localhost", Duration::from_secs(5))
            .await
            .unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
#[cfg_attr(
    rill_skip_ipv6,
    ignore = "RILL_TEST_SKIP contains ipv6: the IPv6 loopback test was skipped on request"
)]
async fn ipv6_loopback_works() {
    if let Err(e) = std::net::UdpSocket::bind("[::1]:0") {
        panic!(
            "this host has no IPv6 loopback (binding [::1]:0: {e}). Enable it \
             (Linux: sysctl net.ipv6.conf.lo.disable_ipv6=0; Docker: --sysctl \
             net.ipv6.conf.all.disable_ipv6=0), or skip this test on purpose with \
             RILL_TEST_SKIP=ipv6 (README.md)."
        );
    }
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let listen: SocketAddr = "[::1]:0".parse().unwrap();
        let server = server_endpoint(listen, &server_tls, &TransportLimits::default()).unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let conn = server.accept().await.unwrap().await.unwrap();
            let (mut send, mut recv) = conn.accept_bi().await.unwrap();
            let f = read_frame(&mut recv, 1024).await.unwrap();
            write_frame(&mut send, f.api_key, f.api_version, &f.meta, &[])
                .await
                .unwrap();
            send.finish().unwrap();
            let _ = send.stopped().await;
        });
        // The dual-stack client endpoint reaches an IPv6 broker; the broker
        // certificate carries ::1.
        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let conn = connect(&client, addr).await.unwrap();
        let response = call(&conn, 3, 0, b"v6", &[], 1024).await.unwrap();
        assert_eq!(&response.meta[..], b"v6");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_port_in_use_is_a_clear_error() {
    let home = tempfile::tempdir().unwrap();
    let (server_tls, _) = dev(home.path());
    let first = server_endpoint(localhost(), &server_tls, &TransportLimits::default()).unwrap();
    let addr = first.local_addr().unwrap();
    let err = server_endpoint(addr, &server_tls, &TransportLimits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{addr} is already in use: is another broker running? pass --listen HOST:PORT")
    );
}

#[tokio::test]
async fn no_broker_at_the_address_is_a_clear_timeout() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        ensure_dev_ca(home.path()).unwrap();
        let (_, client_tls) = dev(home.path());
        // A port nobody listens on: bind one, note it, release it.
        let addr = std::net::UdpSocket::bind(localhost())
            .unwrap()
            .local_addr()
            .unwrap();
        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let err = connect_named(&client, addr, "127.0.0.1", Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("no broker answering at {addr} (UDP)")),
            "{err}"
        );
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn certificate_files_and_client_certificates_work() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let ca = ensure_dev_ca(home.path()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (chain, key) = ca.issue_server_cert(&[]).unwrap();
        let cert_path = dir.path().join("broker.pem");
        let key_path = dir.path().join("broker-key.pem");
        std::fs::write(&cert_path, pem("CERTIFICATE", &chain[0])).unwrap();
        std::fs::write(&key_path, pem("PRIVATE KEY", key.secret_der())).unwrap();
        let (chain, key) = ca.issue_client_cert("producer-1").unwrap();
        let client_cert = dir.path().join("client.pem");
        let client_key = dir.path().join("client-key.pem");
        std::fs::write(&client_cert, pem("CERTIFICATE", &chain[0])).unwrap();
        std::fs::write(&client_key, pem("PRIVATE KEY", key.secret_der())).unwrap();

        let ca_path = ca.cert_path().to_path_buf();
        let server_tls = ServerTls::Files {
            cert: cert_path,
            key: key_path,
            client_auth: rill_net::ClientAuth::Required(ca_path.clone()),
        };
        let server = start_echo_server(&server_tls, 1 << 20);
        let addr = server.local_addr().unwrap();

        let mutual = ClientTls::Mutual {
            ca: ca_path.clone(),
            cert: client_cert,
            key: client_key,
        };
        let client = client_endpoint(&mutual, &TransportLimits::default()).unwrap();
        let conn = connect(&client, addr).await.unwrap();
        let response = call(&conn, 2, 0, b"hi", &[], 1024).await.unwrap();
        assert_eq!(&response.meta[..], b"hi");

        // Without a client certificate the broker refuses the client.
        let anonymous =
            client_endpoint(&ClientTls::CaFile(ca_path), &TransportLimits::default()).unwrap();
        match connect(&anonymous, addr).await {
            Err(NetError::TlsHandshake { reason, .. }) => {
                assert!(reason.contains("client certificate"), "{reason}")
            }
            // In TLS 1.3 the client finishes its handshake before the server
            // checks its certificate; the refusal then ends the connection, and
            // the first call says why (the TLS alert), not just "connection lost".
            Ok(conn) => {
                let err = call(&conn, 2, 0, b"hi", &[], 1024).await.unwrap_err();
                assert!(matches!(err, NetError::ClientCertRefused { .. }), "{err}");
                assert!(err.to_string().contains("certificate_required"), "{err}");
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    })
    .await
    .unwrap();
}

/// PEM-encodes DER (test helper; rill-net only reads PEM).
fn pem(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[tokio::test]
async fn a_connection_refused_before_the_handshake_is_named() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let server =
            server_endpoint(localhost(), &server_tls, &TransportLimits::default()).unwrap();
        let addr = server.local_addr().unwrap();
        let refusing = server.clone();
        tokio::spawn(async move {
            while let Some(incoming) = refusing.accept().await {
                incoming.refuse();
            }
        });
        let client = client_endpoint(&client_tls, &TransportLimits::default()).unwrap();
        let err = connect(&client, addr).await.unwrap_err();
        assert!(matches!(err, NetError::Refused { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("refused the connection"), "{text}");
        assert!(text.contains("max_connections_per_ip"), "{text}");
    })
    .await
    .unwrap();
}

/// A client sealing with either library's AES-GCM talks to a server using this
/// CPU's choice (`AeadLibrary::for_this_cpu`), so brokers and clients on CPUs
/// that choose differently work together: 4 MiB each way in packets of up to
/// 64 KiB, where the two libraries take their wide-vector code paths.
#[tokio::test]
async fn clients_sealing_with_either_aead_library_talk_to_a_server() {
    use rill_net::tls::AeadLibrary;
    tokio::time::timeout(TEST_TIMEOUT, async {
        let home = tempfile::tempdir().unwrap();
        let (server_tls, client_tls) = dev(home.path());
        let server = start_echo_server(&server_tls, 8 << 20);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.local_addr().unwrap().port()));
        let payload = pattern(4 << 20);
        let limits = TransportLimits::default();
        for aead in [AeadLibrary::AwsLc, AeadLibrary::Ring] {
            let mut client = client_endpoint(&client_tls, &limits).unwrap();
            client.set_default_client_config(
                rill_net::client_config_with(&client_tls, &limits, aead).unwrap(),
            );
            let conn = connect(&client, addr).await.unwrap();
            let response = call(&conn, 7, 0, b"", &[payload.clone()], 8 << 20)
                .await
                .unwrap();
            assert!(response.payload == payload, "{aead:?}: the echo differs");
            conn.close(0u32.into(), b"done");
            client.wait_idle().await;
        }
    })
    .await
    .unwrap();
}
