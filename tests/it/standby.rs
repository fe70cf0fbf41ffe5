//! A standby replica writes nothing and says nothing of writing (issue 29 item 3): with
//! `--annotate-cilium-ignore`, "annotating served CiliumNodes with ipam.cilium.io/ignore=true"
//! was logged before "became leader", by a replica that never led. The binary runs against a
//! loopback stand-in of the API server whose leader Lease another replica holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One HTTP/1.1 request per connection (`Connection: close`): enough for kube's client.
async fn serve(listener: TcpListener, seen: Arc<Mutex<Vec<String>>>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            return;
        };
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf);
            let line = head.lines().next().unwrap_or_default().to_string();
            seen.lock().unwrap().push(line.clone());
            let path = line.split(' ').nth(1).unwrap_or_default();
            let (status, body) = if path.starts_with("/version") {
                (
                    "200 OK",
                    serde_json::json!({"major": "1", "minor": "36", "gitVersion": "v1.36.2",
                        "gitCommit": "", "gitTreeState": "", "buildDate": "",
                        "goVersion": "", "compiler": "", "platform": "linux/amd64"}),
                )
            } else if path.contains("/leases/eni-operator") {
                let now = k8s_openapi::jiff::Timestamp::now();
                (
                    "200 OK",
                    serde_json::json!({
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": "eni-operator", "namespace": "kube-system",
                                     "resourceVersion": "7"},
                        "spec": {"holderIdentity": "the-leader", "leaseDurationSeconds": 3600,
                                 "acquireTime": now.to_string(), "renewTime": now.to_string(),
                                 "leaseTransitions": 0}
                    }),
                )
            } else {
                (
                    "404 Not Found",
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found"}),
                )
            };
            let body = body.to_string();
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes()).await;
        });
    }
}

#[tokio::test]
async fn a_standby_with_annotate_cilium_ignore_writes_nothing_and_says_nothing_of_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(serve(listener, seen.clone()));

    let dir = std::env::temp_dir().join(format!("eni-operator-standby-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
             http://127.0.0.1:{port}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- \
             name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_eni-operator"))
        .args([
            "--annotate-cilium-ignore",
            "--cluster-name=standby-test",
            "--aws-region=us-east-1",
            "--namespace=kube-system",
            "--identity=the-standby",
            "--metrics-addr=127.0.0.1:0",
            "--health-addr=127.0.0.1:0",
            "--debug-addr=127.0.0.1:0",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start eni-operator");
    // Long enough to connect, read the Lease a few times (retry period 2 s) and, on the old
    // code, log the line.
    tokio::time::sleep(Duration::from_secs(6)).await;
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|l| l.contains("/leases/eni-operator")),
        "the standby read the Lease: {seen:?}\n{log}"
    );
    assert!(!log.contains("became leader"), "{log}");
    assert!(
        !log.contains("annotating served CiliumNodes"),
        "a standby announced writes it must not make:\n{log}"
    );
    let writes: Vec<&String> = seen.iter().filter(|l| !l.starts_with("GET ")).collect();
    assert!(writes.is_empty(), "a standby wrote: {writes:?}");
}
