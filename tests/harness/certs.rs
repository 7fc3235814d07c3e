//! Test certificates made at test time with the JDK's `keytool`: a CA, and a broker
//! certificate it signed for 127.0.0.1/localhost in a PKCS12 key store (what the broker reads),
//! with the CA certificate exported as PEM (what kmirror reads).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::run_bounded;

pub struct TestCerts {
    /// PEM CA certificate to trust.
    pub ca_pem: PathBuf,
    /// PKCS12 store with the broker's key and its chain.
    pub broker_p12: PathBuf,
    pub password: &'static str,
}

fn keytool(dir: &Path, args: &[&str]) {
    let java = super::jars::java();
    let keytool = java.with_file_name("keytool");
    let mut cmd = Command::new(keytool);
    cmd.args(args).current_dir(dir);
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "keytool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes a fresh CA and broker certificate under `dir`.
pub fn make(dir: &Path) -> TestCerts {
    let pw = "test-store-pw";
    let common = ["-keyalg", "RSA", "-keysize", "2048", "-validity", "3"];
    let store = |name: &str| {
        [
            "-storetype",
            "PKCS12",
            "-keystore",
            name,
            "-storepass",
            pw,
            "-keypass",
            pw,
        ]
        .map(str::to_owned)
    };
    let run = |head: &[&str], store_name: &str, tail: &[&str]| {
        let st = store(store_name);
        let mut args: Vec<&str> = head.to_vec();
        args.extend(st.iter().map(String::as_str));
        args.extend_from_slice(tail);
        keytool(dir, &args);
    };
    let mut ca = vec![
        "-genkeypair",
        "-alias",
        "ca",
        "-dname",
        "CN=kmirror-test-ca",
    ];
    ca.extend_from_slice(&common);
    run(
        &ca,
        "ca.p12",
        &["-ext", "bc:c", "-ext", "KU=keyCertSign,cRLSign"],
    );
    run(
        &["-exportcert", "-rfc", "-alias", "ca"],
        "ca.p12",
        &["-file", "ca.pem"],
    );
    let mut broker = vec!["-genkeypair", "-alias", "broker", "-dname", "CN=localhost"];
    broker.extend_from_slice(&common);
    run(&broker, "broker.p12", &[]);
    run(
        &["-certreq", "-alias", "broker"],
        "broker.p12",
        &["-file", "broker.csr"],
    );
    run(
        &["-gencert", "-alias", "ca", "-rfc", "-validity", "3"],
        "ca.p12",
        &[
            "-infile",
            "broker.csr",
            "-outfile",
            "broker.crt",
            "-ext",
            "SAN=ip:127.0.0.1,dns:localhost",
            "-ext",
            "EKU=serverAuth,clientAuth",
            "-ext",
            "KU=digitalSignature,keyEncipherment",
        ],
    );
    run(
        &["-importcert", "-noprompt", "-alias", "ca"],
        "broker.p12",
        &["-file", "ca.pem"],
    );
    run(
        &["-importcert", "-noprompt", "-alias", "broker"],
        "broker.p12",
        &["-file", "broker.crt"],
    );
    TestCerts {
        ca_pem: dir.join("ca.pem"),
        broker_p12: dir.join("broker.p12"),
        password: pw,
    }
}

/// PEM material made with `openssl` (tests/setup.sh installs it): a CA, and a server
/// certificate it signed for 127.0.0.1/localhost (also good for client auth) with its
/// unencrypted PKCS#8 key. `chain_pem` is the server certificate followed by the CA's.
pub struct PemCerts {
    pub ca_pem: PathBuf,
    pub cert_pem: PathBuf,
    pub chain_pem: PathBuf,
    pub key_pem: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let mut cmd = Command::new("openssl");
    cmd.args(args).current_dir(dir);
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "openssl {args:?} failed (tests/setup.sh installs openssl):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes a fresh CA and server certificate under `dir` with `openssl`.
pub fn make_pem(dir: &Path) -> PemCerts {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "3",
            "-subj",
            "/CN=kmirror-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=keyCertSign,cRLSign",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "3",
            "-extfile",
            "server.ext",
        ],
    );
    let chain = [
        std::fs::read(dir.join("server.pem")).unwrap(),
        std::fs::read(dir.join("ca.pem")).unwrap(),
    ]
    .concat();
    std::fs::write(dir.join("chain.pem"), chain).unwrap();
    PemCerts {
        ca_pem: dir.join("ca.pem"),
        cert_pem: dir.join("server.pem"),
        chain_pem: dir.join("chain.pem"),
        key_pem: dir.join("server.key"),
    }
}
