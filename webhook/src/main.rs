//! nmo-webhook binary: parse flags, start logging, run until SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use nmo_webhook::config::Config;

fn main() -> ExitCode {
    let config = Config::parse_from(shared::serve::goflags::normalize(std::env::args_os()));
    // Dropped at the end of main: flushes queued log lines before exit.
    let _log = shared::serve::telemetry::init_logging(&config.runtime.log);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.worker_threads > 0 {
        builder.worker_threads(config.worker_threads);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, worker_threads = config.worker_threads,
                "nmo-webhook cannot start its runtime; check --worker-threads and the process limits");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(nmo_webhook::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "nmo-webhook failed to start");
            ExitCode::FAILURE
        }
    }
}
