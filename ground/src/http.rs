//! The ground's one HTTP client, for its requests to the doubles and the products on loopback.
//!
//! Building a reqwest client reads the platform's trust store (every certificate under
//! `SSL_CERT_FILE` and `SSL_CERT_DIR`). Built per request, as the polls of Bosun's `/jobs` did
//! (every 5 ms while Bosun works), that parsing was most of a scenario's CPU in a debug build,
//! taken from the products it waits on. One client per process instead, without an idle pool:
//! a pooled connection belongs to the tokio runtime that opened it, and each test has its own.

use std::sync::OnceLock;

/// A clone of the process's client (cheap: clients share their state).
pub fn client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            gitops_loop::forge::github::install_crypto_provider();
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("an HTTP client with the default TLS settings builds")
        })
        .clone()
}
