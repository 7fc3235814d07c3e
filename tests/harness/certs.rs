//! Test certificates made at test time with the JDK's `keytool`: a CA, and a broker
//! certificate it signed for 127.0.0.1/localhost in a PKCS12 key store (what the broker reads),
//! with the CA certificate exported as PEM (what kmirror reads). And, with the `openssl` CLI,
//! PEM files for kmirror's own TLS listeners (`make_pem`).

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

/// PEM files for a TLS listener and its clients: a CA, a server certificate it signed for
/// 127.0.0.1/localhost, a client certificate it signed, and a client certificate signed by
/// another CA (which kmirror must refuse). Keys are unencrypted PKCS#8, mode 0600.
pub struct PemCerts {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// What kmirror must report as the client's principal (Kafka's RFC 2253 form).
    pub client_principal: &'static str,
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
    /// A second client certificate of the same CA, for the operator (a test makes its
    /// principal a super user to create ACLs over mTLS).
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub admin_principal: &'static str,
}

impl PemCerts {
    /// A `[[kafka.listeners]]` section named `name` with `protocol` (SSL or SASL_SSL) serving
    /// the server certificate, trusting the CA for client certificates, and `ssl_client_auth`.
    pub fn listener(&self, name: &str, protocol: &str, client_auth: &str) -> String {
        format!(
            "[[kafka.listeners]]\nname = \"{name}\"\nlisten = \"127.0.0.1:0\"\n\
             security_protocol = \"{protocol}\"\nssl_keystore_location = \"{}\"\n\
             ssl_key_location = \"{}\"\nssl_truststore_location = \"{}\"\n\
             ssl_client_auth = \"{client_auth}\"\n",
            self.server_cert.display(),
            self.server_key.display(),
            self.ca.display()
        )
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let mut cmd = Command::new("openssl");
    cmd.args(args).current_dir(dir);
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "openssl {args:?} failed (the tests need the openssl CLI):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes fresh PEM certificates under `dir` with the `openssl` CLI.
pub fn make_pem(dir: &Path) -> PemCerts {
    use std::os::unix::fs::PermissionsExt;
    let ca = |name: &str, subject: &str| {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "3",
                "-subj",
                subject,
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        )
    };
    ca("ca", "/CN=kmirror-test-ca");
    ca("stranger-ca", "/CN=some-other-ca");
    let signed = |name: &str, subject: &str, by: &str, ext: &str| {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                subject,
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{by}.pem"),
                "-CAkey",
                &format!("{by}.key"),
                "-CAcreateserial",
                "-days",
                "3",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
        let key = dir.join(format!("{name}.key"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    signed(
        "server",
        "/CN=localhost",
        "ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n\
         keyUsage=digitalSignature,keyEncipherment\n",
    );
    let client_ext = "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n";
    signed("client", "/C=US/O=acme/OU=eng/CN=alice", "ca", client_ext);
    signed("stranger", "/CN=mallory", "stranger-ca", client_ext);
    signed("admin", "/O=acme/CN=kmirror-admin", "ca", client_ext);
    PemCerts {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
        client_principal: "User:CN=alice,OU=eng,O=acme,C=US",
        stranger_cert: dir.join("stranger.pem"),
        stranger_key: dir.join("stranger.key"),
        admin_cert: dir.join("admin.pem"),
        admin_key: dir.join("admin.key"),
        admin_principal: "User:CN=kmirror-admin,O=acme",
    }
}
