//! Test support: a kube client for a stand-in API server (an axum router on loopback), for
//! the tests of the runtime's Kubernetes I/O that need no real API server.

/// Serve `app` on a free loopback port and return a client talking to it.
pub(crate) async fn client(app: axum::Router) -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}
