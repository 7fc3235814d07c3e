//! Goals (issue 12, admin API): beyond loopback the admin API needs a bearer token read from a
//! private file; it can be served over TLS; requests whose `Host` is a name nobody configured
//! (DNS rebinding from a browser) are refused; the CLI and doctor reach a guarded API with
//! the same token file. Method: a real `kmirror serve` with `[admin]` token_file and TLS on
//! loopback, asked with the `kmirror mirrors` CLI and with raw HTTPS requests.

mod harness;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use harness::certs::make_pem;
use harness::mirrors_cli::{free_loopback_port, write_admin_config};
use harness::serve::Serve;

const TOKEN: &str = "4f1c0e9a7d2b46e8a1c3f5b7d9e0a2c4";

fn private_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn mirrors(admin: &str, extra: &[&str], args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("mirrors")
        .args(args)
        .args(["--admin", admin])
        .args(extra)
        .env_remove("KMIRROR_ADMIN_TOKEN_FILE")
        .output()
        .unwrap()
}

/// An HTTPS agent trusting the test CA; statuses are answers, not errors.
fn agent(ca: &Path) -> ureq::Agent {
    let pem = std::fs::read(ca).unwrap();
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                .build(),
        )
        .build()
        .into()
}

#[test]
fn a_token_and_tls_guard_every_route_and_the_cli_passes_them() {
    let work = tempfile::tempdir().unwrap();
    let certs = make_pem(work.path());
    let token_file = work.path().join("admin.token");
    private_file(&token_file, &format!("{TOKEN}\n"));
    let port = free_loopback_port();
    let admin = format!("127.0.0.1:{port}");
    let config = work.path().join("kmirror.toml");
    write_admin_config(
        &config,
        &admin,
        &work.path().join("data"),
        &format!(
            "token_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n\
             allowed_hosts = [\"kmirror-dr.example\"]",
            token_file.display(),
            certs.chain_pem.display(),
            certs.key_pem.display()
        ),
    );
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let https = format!("https://{admin}");
    let token_arg = token_file.to_str().unwrap();
    let ca_arg = certs.ca_pem.to_str().unwrap();
    let guarded = ["--admin-token-file", token_arg, "--admin-ca-file", ca_arg];
    // Up: the CLI with the token and the CA lists the (no) mirrors.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        serve.assert_running();
        let out = mirrors(&https, &guarded, &["list", "--json"]);
        if out.status.success() {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "guarded admin API never answered the CLI: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Without the token: refused, and the CLI says what is missing.
    let out = mirrors(&https, &["--admin-ca-file", ca_arg], &["list"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Authorization: Bearer"), "{err}");
    // Plain HTTP on the TLS port is not served.
    let out = mirrors(&admin, &["--admin-token-file", token_arg], &["list"]);
    assert!(!out.status.success(), "plain HTTP answered on the TLS port");

    let a = agent(&certs.ca_pem);
    let url = |path: &str| format!("https://{admin}{path}");
    let bearer = format!("Bearer {TOKEN}");
    // /metrics is guarded too (Prometheus sends the token with `authorization`).
    let r = a.get(url("/metrics")).call().unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("www-authenticate").is_some());
    let mut r = a
        .get(url("/metrics"))
        .header("Authorization", &bearer)
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.body_mut().read_to_string().unwrap().contains("kmirror_"));
    let wrong = format!("Bearer {}x", &TOKEN[..TOKEN.len() - 1]);
    let r = a
        .get(url("/mirrors"))
        .header("Authorization", &wrong)
        .call()
        .unwrap();
    assert_eq!(r.status(), 401);
    // DNS rebinding: a browser sends the attacker's name as Host, even with a stolen cookie
    // or token; a listed name passes.
    let r = a
        .get(url("/mirrors"))
        .header("Authorization", &bearer)
        .header("Host", "attacker.example")
        .call()
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = a
        .get(url("/mirrors"))
        .header("Authorization", &bearer)
        .header("Host", format!("kmirror-dr.example:{port}"))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    // The token never reaches the log.
    serve.assert_running();
    assert!(!serve.log_text().contains(TOKEN), "the token is in the log");
}

fn serve_refuses(work: &Path, admin_listen: &str, admin_extra: &str, why: &str) {
    let config = work.join(format!("refused-{}.toml", why.len()));
    write_admin_config(&config, admin_listen, &work.join("data"), admin_extra);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kmirror"));
    cmd.args(["serve", "--config"]).arg(&config);
    let out = harness::run_bounded(&mut cmd, Duration::from_secs(60));
    assert!(!out.status.success(), "serve started although {why}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(why), "expected {why:?} in:\n{err}");
    assert!(!err.contains(TOKEN), "the token is in the error:\n{err}");
}

#[test]
fn an_exposed_token_or_a_public_bind_without_one_is_refused_at_start() {
    let work = tempfile::tempdir().unwrap();
    let token_file = work.path().join("admin.token");
    std::fs::write(&token_file, TOKEN).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    serve_refuses(
        work.path(),
        &admin,
        &format!("token_file = \"{}\"", token_file.display()),
        "is readable by others",
    );
    // Any address but loopback needs a token (the config is refused before binding).
    serve_refuses(work.path(), "0.0.0.0:0", "", "is not a loopback address");
    let short = work.path().join("short.token");
    private_file(&short, "abc");
    serve_refuses(
        work.path(),
        &admin,
        &format!("token_file = \"{}\"", short.display()),
        "at least 16 are required",
    );
}
