//! SIGTERM / SIGINT turned into a future any task can await: the one place
//! both services handle signals.

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Installed signal handlers; `requested()` resolves once either signal arrived.
pub struct Signals {
    rx: watch::Receiver<bool>,
}

impl Signals {
    /// Install the handlers now, so a signal that arrives during start-up is not lost.
    pub fn install() -> std::io::Result<Self> {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = which, "shutdown signal received");
            let _ = tx.send(true);
            // Keep the sender (and thus the receivers' view) alive until exit.
            std::future::pending::<()>().await;
        });
        Ok(Signals { rx })
    }

    /// Resolves once shutdown was requested.
    pub fn requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.rx.clone();
        async move {
            // An error means the sender is gone, which only happens at exit.
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}
