//! A steady stream of creates through the API server, each judged by the
//! webhook: what a renewal, a rolling upgrade or a killed pod must not
//! interrupt. Every answer but success counts as a failed admission, kept
//! with its time into the stream and the API server's words.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::Client;

use crate::wait::{Poll, until};
use crate::webhook_pod::{create_with_warnings, test_nm};

/// Dry-run creates of NodeMaintenances `<group>-load-<n>` for `node`, back to
/// back, until the stream is dropped or stopped.
pub struct Stream {
    ok: Arc<AtomicU64>,
    /// Each failed admission: ms into the stream, and the API server's answer.
    failed: Arc<std::sync::Mutex<Vec<(u128, String)>>>,
    stop: Arc<AtomicBool>,
}

impl Stream {
    pub fn start(client: Client, group: String, node: String) -> Stream {
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (o, f, s) = (ok.clone(), failed.clone(), stop.clone());
        let t0 = Instant::now();
        tokio::spawn(async move {
            let mut i = 0u64;
            while !s.load(Ordering::SeqCst) {
                i += 1;
                let nm = test_nm(&format!("{group}-load-{i}"), &node);
                match create_with_warnings(&client, &nm, true).await {
                    Ok(_) => {
                        o.fetch_add(1, Ordering::SeqCst);
                    }
                    Err((code, m)) => {
                        if let Ok(mut v) = f.lock() {
                            v.push((t0.elapsed().as_millis(), format!("{code}: {m}")));
                        }
                    }
                }
            }
        });
        Stream { ok, failed, stop }
    }

    /// Admitted so far, and every failed admission.
    pub fn counts(&self) -> (u64, Vec<(u128, String)>) {
        let failed = self.failed.lock().map(|v| v.clone()).unwrap_or_default();
        (self.ok.load(Ordering::SeqCst), failed)
    }

    /// Wait until `n` more creates went through (within `deadline`).
    pub async fn wait_more(&self, n: u64, deadline: Duration) -> anyhow::Result<()> {
        let start = self.ok.load(Ordering::SeqCst);
        until(&format!("{n} more admitted creates"), deadline, || async {
            let (ok, failed) = self.counts();
            Ok(if ok >= start + n {
                Poll::Ready(())
            } else {
                Poll::Pending(format!(
                    "{} admitted, {} failed: {:?}",
                    ok - start,
                    failed.len(),
                    failed.last()
                ))
            })
        })
        .await
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop();
    }
}
