//! Goal: `kmirror serve` refuses bad configuration with a message naming the key, and exits with
//! failure before touching the source. Method: run the binary on bad files.

use std::process::Command;

fn serve(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_config_is_refused_with_the_key() {
    let base =
        "[source]\nbootstrap_servers = [\"127.0.0.1:1\"]\n[storage]\ndata_dir = \"/tmp/x\"\n";
    let (ok, err) = serve(&format!("{base}[topics]\nnames = []\n"));
    assert!(!ok);
    assert!(err.contains("topics: set either names or regex"), "{err}");
    let (ok, err) = serve(&format!(
        "{base}[topics]\nnames = [\"t\"]\n[fetch]\nmax_bytes = 0\n"
    ));
    assert!(!ok);
    assert!(err.contains("fetch.max_bytes"), "{err}");
    let (ok, err) = serve(&format!("{base}[topics]\nnames = [\"t\"]\nbogus = 1\n"));
    assert!(!ok);
    assert!(err.contains("bogus"), "{err}");
    let (ok, err) = serve("not toml at all [");
    assert!(!ok);
    assert!(err.contains("c.toml"), "{err}");
}

#[test]
fn unreachable_source_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[source]\nbootstrap_servers = [\"127.0.0.1:1\"]\n[topics]\nnames = [\"t\"]\n\
         [storage]\ndata_dir = \"{}\"\n",
        dir.path().join("d").display()
    );
    let (ok, err) = serve(&config);
    assert!(!ok);
    assert!(
        err.contains("no bootstrap server answered") && err.contains("127.0.0.1:1"),
        "{err}"
    );
}
