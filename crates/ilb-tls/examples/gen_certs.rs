//! Writes a throwaway CA and certificates it issued into a directory, for trying TLS on
//! loopback and for the TLS benchmark (never for production):
//!
//! ```sh
//! cargo run -p ilb-tls --features test-certs --example gen_certs -- /tmp/ilb-certs
//! ```
//!
//! `ca.pem`; `server.pem`/`server.key` for `127.0.0.1`, `::1` and `localhost`;
//! `client.pem`/`client.key` naming `spiffe://ilb/dp/local` (mutual TLS).
#![allow(clippy::disallowed_methods)] // an example program: reads its argv and writes the files it makes

use ilb_tls::testing::TestCa;
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: gen_certs DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&dir)?;
    let ca = TestCa::new("ilb throwaway test ca");
    let server = ca.issue(&["127.0.0.1", "::1", "localhost"]);
    let client = ca.issue_client("spiffe://ilb/dp/local");
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    std::fs::write(dir.join("server.pem"), &server.cert_pem)?;
    std::fs::write(dir.join("server.key"), &server.key_pem)?;
    std::fs::write(dir.join("client.pem"), &client.cert_pem)?;
    std::fs::write(dir.join("client.key"), &client.key_pem)?;
    println!("wrote ca.pem, server.pem, server.key, client.pem, client.key to {}", dir.display());
    Ok(())
}
