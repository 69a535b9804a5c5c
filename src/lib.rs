//! The product library: the gate's render engine and verdict, the observer and Bosun.
pub mod bosun;
pub mod forge;
pub mod gate;
pub mod git;
pub mod model;
pub mod names;
pub mod observer;
pub mod paths;
pub mod render;
pub mod schema;
pub mod yaml;

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
