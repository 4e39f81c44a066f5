//! Kafka-protocol brokers for tests (feature `kafka`): tansu on 127.0.0.1, plain, behind TLS
//! or requiring SASL, and the certificates the TLS ones need.

use std::path::{Path, PathBuf};

/// A `tansu` broker (a Kafka-protocol broker in one binary, keeping everything in memory) on
/// a free port of 127.0.0.1, for tests; killed when dropped. The binary is `$CHRONIK_TANSU`,
/// else `tansu` on the `PATH` (`scripts/kafka-broker` builds one). Feature `kafka`.
#[derive(Debug)]
pub struct TestBroker {
    child: std::process::Child,
    /// The TLS terminator in front of the broker ([`TestBroker::start_tls`]).
    proxy: Option<std::process::Child>,
    /// The port clients connect to: the broker's, or its TLS terminator's.
    port: u16,
}

impl TestBroker {
    /// Start one and wait (up to ten seconds) until it listens.
    pub fn start() -> std::io::Result<TestBroker> {
        let port = free_port()?;
        let broker = TestBroker { child: spawn_tansu(port, port, &[])?, proxy: None, port };
        wait_listening(port)?;
        Ok(broker)
    }

    /// Start one that requires SASL authentication (tansu's `--authentication`: SCRAM, and
    /// no user exists in its memory storage, so every login is refused).
    pub fn start_sasl() -> std::io::Result<TestBroker> {
        let port = free_port()?;
        let child = spawn_tansu(port, port, &["--authentication"])?;
        let broker = TestBroker { child, proxy: None, port };
        wait_listening(port)?;
        Ok(broker)
    }

    /// Start one behind TLS with `certificates`' server certificate, requiring a client
    /// certificate if `mutual`. tansu 0.6 takes `--cert` and `--key` and still serves
    /// plaintext, so a TLS terminator in Python's standard library (`python3`, or
    /// `$CHRONIK_PYTHON`) listens in front of it, and the broker advertises its port.
    pub fn start_tls(certificates: &TestCertificates, mutual: bool) -> std::io::Result<TestBroker> {
        let broker_port = free_port()?;
        let port = free_port()?;
        let mut broker =
            TestBroker { child: spawn_tansu(broker_port, port, &[])?, proxy: None, port };
        wait_listening(broker_port)?;
        let python = std::env::var("CHRONIK_PYTHON").unwrap_or_else(|_| "python3".to_owned());
        let mut proxy = std::process::Command::new(&python);
        proxy.arg("-c").arg(include_str!("tls_proxy.py"));
        proxy.arg(port.to_string()).arg(broker_port.to_string());
        proxy.arg(&certificates.server_cert).arg(&certificates.server_key);
        if mutual {
            proxy.arg(&certificates.ca);
        }
        let proxy = proxy
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start {python}: {e}")))?;
        broker.proxy = Some(proxy);
        wait_listening(port)?;
        Ok(broker)
    }

    /// `127.0.0.1:PORT`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `kafka://127.0.0.1:PORT`, a target for [`crate::connect`].
    pub fn target(&self) -> String {
        format!("kafka://{}", self.bootstrap())
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        for child in std::iter::once(&mut self.child).chain(self.proxy.as_mut()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// tansu (`$CHRONIK_TANSU`, else `tansu` on the `PATH`) listening on `port` and advertising
/// `advertised` (the port clients reach it at), in memory.
fn spawn_tansu(port: u16, advertised: u16, args: &[&str]) -> std::io::Result<std::process::Child> {
    let binary = std::env::var("CHRONIK_TANSU").unwrap_or_else(|_| "tansu".to_owned());
    let listen = format!("tcp://127.0.0.1:{port}");
    let advertised = format!("tcp://127.0.0.1:{advertised}");
    std::process::Command::new(&binary)
        .args(["broker", "--listener-url", &listen, "--advertised-listener-url", &advertised])
        .args(["--storage-engine", "memory://tansu/"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start {binary}: {e}")))
}

/// Wait (up to ten seconds) until something listens on `port` of 127.0.0.1.
fn wait_listening(port: u16) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::other(format!("nothing listened on port {port}")));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// A certificate authority made for one test with the `openssl` command, and what it signed:
/// a server certificate for 127.0.0.1 and localhost, and a client certificate whose key is
/// encrypted with [`TestCertificates::KEY_PASSWORD`]. Feature `kafka`.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TestCertificates {
    /// The passphrase of the client's key (a secret the tests look for in every output).
    pub const KEY_PASSWORD: &'static str = "client-key-passphrase-7f3a9c";

    /// Make them in `directory` (which must exist).
    pub fn make(directory: &Path) -> std::io::Result<TestCertificates> {
        let path = |name: &str| directory.join(name);
        let openssl = |args: &[&std::ffi::OsStr]| -> std::io::Result<()> {
            let output =
                std::process::Command::new("openssl").args(args).output().map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot run openssl (scripts/system-packages): {e}"),
                    )
                })?;
            if output.status.success() {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&output.stderr);
            Err(std::io::Error::other(format!("openssl {args:?} failed: {stderr}")))
        };
        let os = |text: &'static str| std::ffi::OsStr::new(text);
        let ec = [os("-newkey"), os("ec"), os("-pkeyopt"), os("ec_paramgen_curve:prime256v1")];
        let certificates = TestCertificates {
            ca: path("ca.pem"),
            server_cert: path("server.pem"),
            server_key: path("server.key"),
            client_cert: path("client.pem"),
            client_key: path("client.key"),
        };
        let ca_key = path("ca.key");
        let mut args = vec![os("req"), os("-x509"), os("-nodes"), os("-days"), os("2")];
        args.extend(ec);
        args.extend([os("-subj"), os("/CN=chronik-test-ca"), os("-keyout"), ca_key.as_os_str()]);
        args.extend([os("-out"), certificates.ca.as_os_str()]);
        openssl(&args)?;
        let extensions = path("server.ext");
        std::fs::write(&extensions, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")?;
        let password = format!("pass:{}", TestCertificates::KEY_PASSWORD);
        for (cert, key, subject, encrypted) in [
            (&certificates.server_cert, &certificates.server_key, "/CN=localhost", false),
            (&certificates.client_cert, &certificates.client_key, "/CN=chronik-test-client", true),
        ] {
            let request = path("request.csr");
            let mut args = vec![os("req"), os("-new")];
            args.extend(ec);
            args.extend([os("-subj"), os(subject), os("-keyout"), key.as_os_str()]);
            args.extend([os("-out"), request.as_os_str()]);
            if encrypted {
                args.extend([os("-passout"), std::ffi::OsStr::new(&password)]);
            } else {
                args.push(os("-nodes"));
            }
            openssl(&args)?;
            let mut args = vec![os("x509"), os("-req"), os("-days"), os("2"), os("-in")];
            args.extend([request.as_os_str(), os("-CA"), certificates.ca.as_os_str()]);
            args.extend([os("-CAkey"), ca_key.as_os_str(), os("-CAcreateserial")]);
            args.extend([os("-out"), cert.as_os_str(), os("-extfile"), extensions.as_os_str()]);
            openssl(&args)?;
        }
        Ok(certificates)
    }
}
