//! The product library: the gate's render engine and verdict, the observer and Bosun.
pub mod bosun;
pub mod forge;
pub mod gate;
pub mod git;
pub mod inventory;
pub mod model;
pub mod names;
pub mod observer;
pub mod paths;
pub mod remote_cache;
pub mod render;
pub mod schema;
pub mod scratch;
pub mod yaml;

/// The plural ending of a count in English text the programs print: `""` for one, `"s"`
/// otherwise ("1 file", "2 files").
pub fn plural<N: PartialEq + From<u8>>(n: N) -> &'static str {
    if n == N::from(1) { "" } else { "s" }
}

/// Resolves on SIGTERM (how Kubernetes stops a Pod) or Ctrl-C: the servers' graceful shutdown.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn plural_is_empty_for_one_only() {
        assert_eq!(super::plural(1usize), "");
        assert_eq!(super::plural(0usize), "s");
        assert_eq!(super::plural(2u32), "s");
    }
}
