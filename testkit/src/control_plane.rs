//! A real Kubernetes control plane for tests: etcd, kube-apiserver (RBAC on) and
//! kube-controller-manager (garbage collection, service-account tokens), started from the
//! binaries in the directory named by `KUBEBUILDER_ASSETS` (the envtest convention of Kubernetes
//! controller projects; nothing here downloads or builds them).
//!
//! Usage (a shell, another worktree, a script):
//!
//! ```text
//! export KUBEBUILDER_ASSETS=/dir/with/etcd+kube-apiserver+kube-controller-manager+kubectl
//! cargo run -p testkit --bin control-plane -- --kubeconfig /tmp/cp.kubeconfig &
//! # the kubeconfig appears (atomically) once the API server is ready, OpenAPI included
//! while [ ! -s /tmp/cp.kubeconfig ]; do sleep 0.5; done
//! KUBECONFIG=/tmp/cp.kubeconfig kubectl get ns
//! kill %1   # SIGTERM or SIGINT stops etcd, kube-apiserver and kube-controller-manager
//! ```
//!
//! From Rust: [`ControlPlane::start`]; dropping the value (normal return, error, panic) stops
//! everything it started and removes its data directory. Orphan protection: on Linux every child
//! gets `PR_SET_PDEATHSIG(SIGKILL)`, so a SIGKILLed launcher takes its children with it. That
//! signal follows the *thread* that started them: call `start` from a thread that lives as long
//! as the control plane (a test's own thread, `main`; not a `spawn_blocking` worker).
//!
//! Ports are free loopback ports picked per start (two suites can run at once); data lives in a
//! fresh directory under the system temp dir. Flags: the facts that work for kube-apiserver
//! v1.36 (the assets' README), one CA for serving and client certificates, an ECDSA
//! service-account key pair.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The environment variable naming the directory with the binaries.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// How long each component may take to become ready (a loaded 2-core machine: several times
/// the ~5 s of an idle one).
const READY_LIMIT: Duration = Duration::from_secs(120);

/// Starts made before a taken port is an error, and how Go's `net.Listen` says it (etcd,
/// kube-apiserver and kube-controller-manager all log the syscall's text).
const PORT_ATTEMPTS: u32 = 3;
const PORT_TAKEN: &str = "address already in use";

/// The assets directory from `KUBEBUILDER_ASSETS`, if set and non-empty.
pub fn assets_from_env() -> Option<PathBuf> {
    std::env::var_os(ASSETS_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A running control plane. Dropping it stops every process and removes its data directory.
pub struct ControlPlane {
    dir: PathBuf,
    kubectl: PathBuf,
    server: String,
    children: Vec<(&'static str, Child)>,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager from `assets` and returns once the
    /// API server is ready, its OpenAPI v3 lists `apis/apiextensions.k8s.io/v1` (kubectl's
    /// validation needs it) and the controller manager answers.
    pub fn start(assets: &Path) -> Result<Self> {
        Self::start_with_ports(assets, free_port)
    }

    /// [`start`](Self::start) with the ports from `pick`. A port picked free can be taken by
    /// another process before the component binds it (two suites start side by side in CI): a
    /// start that fails with "address already in use" is made again from scratch, new ports.
    pub fn start_with_ports(assets: &Path, mut pick: impl FnMut() -> Result<u16>) -> Result<Self> {
        for bin in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kubectl",
        ] {
            let p = assets.join(bin);
            if !p.is_file() {
                bail!("{ASSETS_ENV}={}: no {bin} there", assets.display());
            }
        }
        let mut attempt = 1;
        loop {
            let dir = std::env::temp_dir().join(format!(
                "eni-control-plane-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default()
            ));
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            // From here on, Drop cleans up whatever was started.
            let mut cp = ControlPlane {
                dir,
                kubectl: assets.join("kubectl"),
                server: String::new(),
                children: Vec::new(),
            };
            match cp.boot(assets, &mut pick) {
                Ok(()) => return Ok(cp),
                Err(e) if attempt < PORT_ATTEMPTS && format!("{e:#}").contains(PORT_TAKEN) => {
                    eprintln!(
                        "control plane: a port was taken before its use; starting again: {e:#}"
                    );
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn boot(&mut self, assets: &Path, pick: &mut impl FnMut() -> Result<u16>) -> Result<()> {
        let dir = self.dir.clone();
        write_pki(&dir)?;
        let (etcd_port, peer_port, api_port, kcm_port) = (pick()?, pick()?, pick()?, pick()?);

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        self.spawn(
            assets,
            "etcd",
            &[
                "--data-dir",
                &path(&dir.join("etcd")),
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("default={peer_url}"),
                "--unsafe-no-fsync",
            ],
        )?;
        self.wait("etcd", || {
            Ok(http_get(etcd_port, "/health")?.contains("\"health\":\"true\""))
        })?;

        self.server = format!("https://127.0.0.1:{api_port}");
        let p = |name: &str| path(&dir.join(name));
        self.spawn(
            assets,
            "kube-apiserver",
            &[
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                &format!("--secure-port={api_port}"),
                &format!("--etcd-servers={etcd_url}"),
                &format!("--tls-cert-file={}", p("apiserver.crt")),
                &format!("--tls-private-key-file={}", p("apiserver.key")),
                &format!("--client-ca-file={}", p("ca.crt")),
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                &format!("--service-account-key-file={}", p("sa.pub")),
                &format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            ],
        )?;
        let admin = dir.join("admin.kubeconfig");
        fs::write(
            &admin,
            kubeconfig(&self.server, &dir, "admin", "admin.crt", "admin.key"),
        )?;
        fs::write(
            dir.join("kcm.kubeconfig"),
            kubeconfig(&self.server, &dir, "kcm", "kcm.crt", "kcm.key"),
        )?;
        let kubectl = self.kubectl.clone();
        self.wait("kube-apiserver /readyz", || {
            Ok(get_raw(&kubectl, &admin, "/readyz")?.trim() == "ok")
        })?;
        self.wait("kube-apiserver OpenAPI v3", || {
            Ok(get_raw(&kubectl, &admin, "/openapi/v3")?.contains("apis/apiextensions.k8s.io/v1"))
        })?;

        let kcm_kubeconfig = p("kcm.kubeconfig");
        fs::create_dir_all(dir.join("flexvolume"))?;
        self.spawn(
            assets,
            "kube-controller-manager",
            &[
                &format!("--kubeconfig={kcm_kubeconfig}"),
                &format!("--authentication-kubeconfig={kcm_kubeconfig}"),
                &format!("--authorization-kubeconfig={kcm_kubeconfig}"),
                "--bind-address=127.0.0.1",
                &format!("--secure-port={kcm_port}"),
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                &format!("--service-account-private-key-file={}", p("sa.key")),
                &format!("--root-ca-file={}", p("ca.crt")),
                &format!("--cluster-signing-cert-file={}", p("ca.crt")),
                &format!("--cluster-signing-key-file={}", p("ca.key")),
                &format!("--client-ca-file={}", p("ca.crt")),
                &format!("--flex-volume-plugin-dir={}", p("flexvolume")),
                "--controllers=*,-service-ca-certificate-publisher-controller",
            ],
        )?;
        // Its /healthz is HTTPS with a self-signed certificate. A listening port is not enough:
        // another process may hold it (then it exits). Its own log line says it serves there
        // (k8s.io/apiserver secure_serving.go: "Serving securely on HOST:PORT").
        let serving = format!("Serving securely on 127.0.0.1:{kcm_port}");
        let kcm_log = dir.join("kube-controller-manager.log");
        self.wait("kube-controller-manager", || {
            Ok(fs::read_to_string(&kcm_log)?.contains(&serving))
        })?;
        Ok(())
    }

    /// The admin kubeconfig (`O=system:masters`); valid while this value lives.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The data directory (certificates, etcd data, each component's log `NAME.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process ids of the running components (etcd, kube-apiserver, kube-controller-manager).
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(_, c)| c.id()).collect()
    }

    /// The component that has exited, if any (a healthy control plane has none).
    pub fn exited(&mut self) -> Option<String> {
        let (name, status) = self
            .children
            .iter_mut()
            .find_map(|(name, child)| Some((*name, child.try_wait().ok()??)))?;
        Some(format!("{name} exited ({status}); {}", self.tail(name)))
    }

    /// Stops every process (SIGTERM, then SIGKILL after 10 s), newest first, and removes the
    /// data directory. Idempotent.
    pub fn stop(&mut self) {
        while let Some((_, mut child)) = self.children.pop() {
            terminate(&mut child);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }

    fn spawn(&mut self, assets: &Path, name: &'static str, args: &[&str]) -> Result<()> {
        let log = fs::File::create(self.dir.join(format!("{name}.log")))?;
        let mut cmd = Command::new(assets.join(name));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", assets.join(name).display()))?;
        self.children.push((name, child));
        Ok(())
    }

    /// Polls `ready` until it answers true, failing early if a component exits.
    fn wait(&mut self, what: &str, mut ready: impl FnMut() -> Result<bool>) -> Result<()> {
        let start = Instant::now();
        loop {
            let last = match ready() {
                Ok(true) => return Ok(()),
                Ok(false) => "not ready".to_string(),
                Err(e) => format!("{e:#}"),
            };
            if let Some(exited) = self.exited() {
                bail!("control plane: waiting for {what}: {exited}");
            }
            if start.elapsed() > READY_LIMIT {
                bail!(
                    "control plane: {what} not ready after {READY_LIMIT:?} ({last}); logs in {}",
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn tail(&self, name: &str) -> String {
        let text = fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "last lines of its log:\n{}",
            lines[lines.len().saturating_sub(15)..].join("\n")
        )
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The certificates and keys, written into the data directory: a CA, the API server's serving
/// certificate (127.0.0.1, localhost), client certificates for the admin (`system:masters`) and
/// the controller manager, and the service-account key pair.
fn write_pki(dir: &Path) -> Result<()> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "eni-operator test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    write_secret(dir, "ca.key", &ca_key.serialize_pem())?;
    fs::write(dir.join("ca.crt"), ca_cert.pem())?;
    let issuer = Issuer::new(ca, ca_key);

    let leaf = |file: &str, sans: Vec<String>, cn: &str, org: Option<&str>, server: bool| {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(org) = org {
            params
                .distinguished_name
                .push(DnType::OrganizationName, org);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &issuer)?;
        fs::write(dir.join(format!("{file}.crt")), cert.pem())?;
        write_secret(dir, &format!("{file}.key"), &key.serialize_pem())?;
        anyhow::Ok(())
    };
    leaf(
        "apiserver",
        vec![
            "127.0.0.1".into(),
            "localhost".into(),
            "kubernetes.default.svc".into(),
        ],
        "kube-apiserver",
        None,
        true,
    )?;
    leaf("admin", vec![], "admin", Some("system:masters"), false)?;
    leaf("kcm", vec![], "system:kube-controller-manager", None, false)?;

    let sa = KeyPair::generate()?;
    write_secret(dir, "sa.key", &sa.serialize_pem())?;
    fs::write(dir.join("sa.pub"), sa.public_key_pem())?;
    Ok(())
}

fn write_secret(dir: &Path, name: &str, pem: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(name))?;
    f.write_all(pem.as_bytes())?;
    Ok(())
}

fn kubeconfig(server: &str, dir: &Path, user: &str, crt: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: control-plane\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\ncontexts:\n- name: {user}\n  context:\n    cluster: control-plane\n    user: {user}\n    namespace: default\ncurrent-context: {user}\n",
        ca = path(&dir.join("ca.crt")),
        crt = path(&dir.join(crt)),
        key = path(&dir.join(key)),
    )
}

/// `kubectl get --raw URL` with the admin kubeconfig.
fn get_raw(kubectl: &Path, kubeconfig: &Path, url: &str) -> Result<String> {
    let out = Command::new(kubectl)
        .arg(format!("--kubeconfig={}", path(kubeconfig)))
        .args(["get", "--raw", url, "--request-timeout=5s"])
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A free loopback port (bound and released: another process could take it in between; the
/// start then fails with that component's log and is made again, it does not hang).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A plain-HTTP GET on loopback (etcd's client port speaks HTTP/1.1).
fn http_get(port: u16, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

fn terminate(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped (try_wait above
        // said it runs), so the pid cannot have been reused.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The child gets SIGKILL when this process dies, however it dies (a SIGKILLed test or
/// benchmark leaves no API server, etcd or operator behind).
#[cfg(target_os = "linux")]
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub fn die_with_parent(_cmd: &mut Command) {}

/// kubectl with one identity (a kubeconfig): tests that act on the API server as a user or an
/// agent would.
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    /// The admin's kubectl of `cp`, from the binaries in `assets`.
    pub fn admin(assets: &Path, cp: &ControlPlane) -> Self {
        Self {
            bin: assets.join("kubectl"),
            kubeconfig: cp.kubeconfig(),
        }
    }

    /// Runs it with `stdin` piped in; its output, whatever the exit.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(crate::piped_if(stdin.is_some()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(text.as_bytes())
                .expect("kubectl's stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// Its stdout when it succeeds, its stderr when it fails.
    pub fn answer(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> std::result::Result<String, String> {
        let out = self.run(args, stdin);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Must succeed; its stdout.
    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        self.answer(args, stdin)
            .unwrap_or_else(|e| panic!("kubectl {args:?} failed: {e}"))
    }
}
