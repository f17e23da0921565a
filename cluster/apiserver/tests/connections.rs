//! Connections that never finish are closed, one client's pile of connections does not
//! shut others out, and a tenant's trickled bodies and open watches are bounded by its seats:
//! what a slowloris, an fd-exhaustion or a memory-pinning attempt meets. Attackers connect
//! from their own loopback addresses (127.0.0.2, 127.0.0.3) so that a well-behaved client on
//! 127.0.0.1 can be checked to be served all along. Deadlines are generous bounds on
//! behaviour (closed at all, far within them), not speed checks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tessera_apiserver::api::{Api, now_secs};
use tessera_apiserver::auth::{TenantClaims, Tokens, User};
use tessera_apiserver::client::{Client, HttpClient, InProcess};
use tessera_apiserver::http;
use tessera_apiserver::pki::Credentials;
use tessera_apiserver::request::{ApiRequest, Verb, find_resource};
use tessera_apiserver::serve::{ConnectionLimits, serve_tls_with};
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn server(limits: ConnectionLimits) -> (SocketAddr, Credentials, tempfile::TempDir) {
    let (addr, creds, dir, _) = server_with_api(limits).await;
    (addr, creds, dir)
}

async fn server_with_api(
    limits: ConnectionLimits,
) -> (SocketAddr, Credentials, tempfile::TempDir, Api) {
    let dir = tempfile::tempdir().expect("tmp");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    let api = Api::new(store, None);
    let creds = Credentials::generate().expect("credentials");
    let router = http::router(api.clone(), Tokens::new(&creds.admin_token));
    let addr = serve_tls_with("127.0.0.1:0".parse().expect("addr"), &creds, router, limits)
        .await
        .expect("serve");
    (addr, creds, dir, api)
}

/// A TCP connection to `server` from loopback address `from`.
async fn connect_from(from: &str, server: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().expect("socket");
    s.bind(format!("{from}:0").parse().expect("addr"))
        .expect("bind");
    s.connect(server).await.expect("connect")
}

/// True if the server closes `s` within `within` (EOF or a reset); false if it stays open.
async fn closed_within(s: &mut (impl AsyncReadExt + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

async fn served(addr: SocketAddr, creds: &Credentials) -> bool {
    let c = HttpClient::new(
        &format!("https://{addr}"),
        &creds.ca_pem,
        &creds.admin_token,
    )
    .expect("client");
    c.get(
        find_resource("", "v1", "namespaces").expect("ns"),
        None,
        "none",
    )
    .await
    .is_err_and(|e| e.code == 404)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_handshakes_and_headers_are_closed() {
    let limits = ConnectionLimits {
        handshake_timeout: Duration::from_secs(1),
        header_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    let (addr, creds, _dir) = server(limits).await;
    // Many TCP connections that never send a ClientHello.
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(connect_from("127.0.0.2", addr).await);
    }
    assert!(served(addr, &creds).await, "others are served meanwhile");
    for s in &mut silent {
        assert!(
            closed_within(s, Duration::from_secs(20)).await,
            "a connection without a handshake is closed"
        );
    }
    // A TLS connection whose request headers never end.
    let mut tls = tls_from("127.0.0.2", addr, &creds).await;
    tls.write_all(b"GET /api HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .await
        .expect("half a request");
    assert!(
        closed_within(&mut tls, Duration::from_secs(20)).await,
        "half-sent headers are not waited on forever"
    );
    assert!(served(addr, &creds).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_every_connection() {
    let limits = ConnectionLimits {
        // Long enough that only the cap can close what is refused below.
        handshake_timeout: Duration::from_secs(60),
        max_per_client: 8,
        ..ConnectionLimits::default()
    };
    let (addr, creds, _dir) = server(limits).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(connect_from("127.0.0.3", addr).await);
    }
    // Let the server count them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut ninth = connect_from("127.0.0.3", addr).await;
    assert!(
        closed_within(&mut ninth, Duration::from_secs(10)).await,
        "the ninth connection of one client is closed"
    );
    assert!(served(addr, &creds).await, "another client is served");
    for s in &mut held {
        assert!(
            !closed_within(s, Duration::from_millis(100)).await,
            "the first eight stay open"
        );
    }
    // Its slots come back when it closes them.
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = connect_from("127.0.0.3", addr).await;
    assert!(
        !closed_within(&mut again, Duration::from_millis(500)).await,
        "accepted again once it closed the others"
    );
}

/// A Tenant `t` owning namespace `t-ns` with `seats` request seats, and a token for it.
async fn tenant(api: &Api, creds: &Credentials, t: &str, seats: i64) -> String {
    let admin = InProcess::new(api.clone(), User::Admin);
    let ns = format!("{t}-ns");
    admin
        .create(
            find_resource("", "v1", "namespaces").expect("ns"),
            None,
            &json!({"metadata": {"name": ns}}),
        )
        .await
        .expect("namespace");
    let obj = admin
        .create(
            find_resource("tessera.io", "v1alpha1", "tenants").expect("tenants"),
            None,
            &json!({"metadata": {"name": t}, "spec": {"namespaces": [ns], "maxInflightRequests": seats}}),
        )
        .await
        .expect("tenant");
    Tokens::new(&creds.admin_token).mint(&TenantClaims::of(&obj, now_secs() + 3600))
}

/// A TLS connection to `addr` from loopback address `from`.
async fn tls_from(
    from: &str,
    addr: SocketAddr,
    creds: &Credentials,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    tls_over(connect_from(from, addr).await, creds).await
}

/// TLS (trusting the server's CA) over `tcp`.
async fn tls_over(
    tcp: TcpStream,
    creds: &Credentials,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    let ca =
        <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::from_pem_slice(
            creds.ca_pem.as_bytes(),
        )
        .expect("ca");
    roots.add(ca).expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().expect("name"), tcp)
        .await
        .expect("handshake")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_read_on_seats_and_watches_are_bounded() {
    let (addr, creds, _dir, api) = server_with_api(ConnectionLimits::default()).await;
    let token = tenant(&api, &creds, "slow", 2).await;
    // Two requests announce 3 MB bodies and trickle a few bytes: each holds a seat while its
    // body comes in.
    let head = format!(
        "POST /api/v1/namespaces/slow-ns/configmaps HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\n\r\n{{\"a\":\""
    );
    let mut trickling = Vec::new();
    for _ in 0..2 {
        let mut s = tls_from("127.0.0.4", addr, &creds).await;
        s.write_all(head.as_bytes()).await.expect("head");
        s.flush().await.expect("flush");
        trickling.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The third is refused before its body is read: 429, at once.
    let mut third = tls_from("127.0.0.4", addr, &creds).await;
    third.write_all(head.as_bytes()).await.expect("head");
    third.flush().await.expect("flush");
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut answer))
        .await
        .expect("answered without its body")
        .expect("read");
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    assert!(text.contains("too many requests in flight"), "{text}");
    drop(trickling);

    // Watches: 4 per seat at least 16 — here 16; the 17th is refused, and a closed one
    // gives its slot back.
    let c = InProcess::new(api.clone(), User::Tenant("slow".into()));
    let watch = || {
        let mut req = ApiRequest::new(
            Verb::Watch,
            find_resource("", "v1", "configmaps").expect("configmaps"),
        );
        req.namespace = Some("slow-ns".into());
        c.call(req)
    };
    let mut open = Vec::new();
    for _ in 0..16 {
        open.push(watch().await.expect("a watch"));
    }
    let e = watch().await.expect_err("the 17th");
    assert_eq!(e.code, 429, "{}", e.message);
    assert!(e.message.contains("too many watches"), "{}", e.message);
    open.pop();
    assert!(watch().await.is_ok(), "a slot came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_holds_seats_until_written_and_a_non_reader_is_closed() {
    // The seats are held from the answer's start until the write timeout ends the stalled
    // connection: long enough that a loaded machine (CI runs this beside the other tests
    // of the file) still sees it, where 2 s once was not.
    let write_timeout = Duration::from_secs(4);
    let limits = ConnectionLimits {
        write_timeout,
        ..ConnectionLimits::default()
    };
    let (addr, creds, _dir, api) = server_with_api(limits).await;
    let token = tenant(&api, &creds, "big", 4).await;
    // About 10 MB of ConfigMaps in the tenant's namespace.
    let admin = InProcess::new(api.clone(), User::Admin);
    let configmaps = find_resource("", "v1", "configmaps").expect("configmaps");
    let filler = "x".repeat(1_000_000);
    for i in 0..10 {
        admin
            .create(
                configmaps,
                Some("big-ns"),
                &json!({"metadata": {"name": format!("c{i}")}, "data": {"v": filler}}),
            )
            .await
            .expect("configmap");
    }
    // A client that asks for the list and reads nothing (a small receive buffer, so the
    // kernel does not take the answer for it).
    let sock = TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(4096).expect("rcvbuf");
    sock.bind("127.0.0.5:0".parse().expect("addr"))
        .expect("bind");
    let tcp = sock.connect(addr).await.expect("connect");
    let mut stalled = tls_over(tcp, &creds).await;
    let get = format!(
        "GET /api/v1/namespaces/big-ns/configmaps HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    stalled.write_all(get.as_bytes()).await.expect("request");
    stalled.flush().await.expect("flush");
    // While its answer is unread it holds all four of the tenant's seats (one per MiB, up to
    // the limit): the tenant's next request is refused, another caller is served.
    let c = InProcess::new(api.clone(), User::Tenant("big".into()));
    let one = || {
        let mut req = ApiRequest::new(Verb::Get, configmaps);
        req.namespace = Some("big-ns".into());
        req.name = Some("c0".into());
        c.call(req)
    };
    // Building a 10 MB answer takes a while under load: looked for over 10 s at most.
    let mut refused = None;
    for _ in 0..1000 {
        match one().await {
            Err(e) if e.code == 429 => {
                refused = Some(e);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let refused = refused.expect("the tenant's seats are held by the unread answer");
    assert!(
        refused.message.contains("too many requests in flight"),
        "{}",
        refused.message
    );
    assert!(served(addr, &creds).await, "others are served meanwhile");
    // The server gives up on the non-reader after the write timeout: its connection ends
    // before the whole answer (over 10 MB) went out, and the seats come back.
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::time::sleep(write_timeout + Duration::from_secs(2)).await;
        loop {
            match stalled.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection was closed");
    assert!(
        got < 10_000_000,
        "the answer was cut short: {got} bytes arrived"
    );
    let mut back = false;
    for _ in 0..100 {
        if one().await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back, "the seats came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_serving_certificate_is_trusted_through_the_same_ca() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    let pki = dir.path().join("pki");
    let first = Credentials::load_or_create(&pki).expect("credentials");
    let mode = std::fs::metadata(pki.join("ca.key"))
        .expect("the CA key is kept")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let until = tessera_apiserver::pki::rotate_serving(&pki).expect("rotate");
    let year: i32 = tessera_apiserver::api::rfc3339(now_secs())[0..4]
        .parse()
        .expect("year");
    assert!(
        until.starts_with(&format!("{}-", year + 1)),
        "a year: {until}"
    );
    let second = Credentials::load_or_create(&pki).expect("credentials");
    assert_ne!(first.cert_pem, second.cert_pem, "a new serving certificate");
    assert_eq!(first.ca_pem, second.ca_pem, "the same CA");
    // Served, it is trusted by a client that knows only the first CA (every kubeconfig).
    let store_dir = tempfile::tempdir().expect("tmp");
    let store = Arc::new(
        EmbeddedStore::open(
            store_dir.path(),
            EmbeddedOptions::small(),
            StoreMetrics::register(&prometheus::Registry::new()).expect("metrics"),
        )
        .await
        .expect("store"),
    );
    let router = http::router(Api::new(store, None), Tokens::new(&second.admin_token));
    let addr = serve_tls_with(
        "127.0.0.1:0".parse().expect("addr"),
        &second,
        router,
        ConnectionLimits::default(),
    )
    .await
    .expect("serve");
    assert!(
        served(addr, &first).await,
        "the old kubeconfig's CA trusts it"
    );
    // A data directory from before the CA key was kept says what to do.
    std::fs::remove_file(pki.join("ca.key")).expect("rm");
    let e = tessera_apiserver::pki::rotate_serving(&pki).expect_err("no CA key");
    assert!(e.to_string().contains("cannot rotate"), "{e}");
}
