//! Loopback throughput of rill-net: one client connection sends `REQUESTS`
//! request frames of `FRAME_KIB` KiB payload, `CONCURRENCY` at a time, to an
//! echo-less server that answers each with a small frame. Used to choose the
//! transport tuning; not a test.
//!
//! Environment: FRAME_KIB (1024), REQUESTS (512), CONCURRENCY (8), MTU (65488),
//! RILL_BENCH_HOME (a temp dir).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rill_net::{
    ClientTls, ServerTls, TransportLimits, call, client_endpoint, connect, read_frame,
    server_endpoint, write_frame,
};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let frame_kib = env("FRAME_KIB", 1024);
    let requests = env("REQUESTS", 512);
    let concurrency = env("CONCURRENCY", 8);
    let limits = TransportLimits {
        mtu_upper_bound: env("MTU", 65488) as u16,
        ..TransportLimits::default()
    };
    let home = tempfile::tempdir().unwrap();
    let server_tls = ServerTls::Dev {
        home: home.path().to_path_buf(),
    };
    let server = server_endpoint(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        &server_tls,
        &limits,
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            tokio::spawn(async move {
                let conn = incoming.await.unwrap();
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    tokio::spawn(async move {
                        let f = read_frame(&mut recv, 256 << 20).await.unwrap();
                        write_frame(&mut send, f.api_key, 0, b"ok", &[])
                            .await
                            .unwrap();
                        send.finish().unwrap();
                    });
                }
            });
        }
    });

    let client_tls = ClientTls::Dev {
        home: home.path().to_path_buf(),
    };
    let client = client_endpoint(&client_tls, &limits).unwrap();
    let conn = connect(&client, addr).await.unwrap();
    let payload = Bytes::from(vec![0x5a; frame_kib * 1024]);
    let semaphore = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(requests);
    for i in 0..requests {
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        let conn = conn.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let r = call(&conn, i as u16, 0, b"bench", &[payload], 1024)
                .await
                .unwrap();
            drop(permit);
            r
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let mib = (requests * frame_kib) as f64 / 1024.0;
    let stats = conn.stats();
    println!(
        "frame {frame_kib} KiB x {requests}, concurrency {concurrency}, mtu bound {}: {:.0} MiB/s, {:.0} req/s, path mtu {}, lost {}",
        limits.mtu_upper_bound,
        mib / secs,
        requests as f64 / secs,
        stats.path.current_mtu,
        stats.path.lost_packets,
    );
}
