//! nmo-webhook binary: parse flags, start logging, run until SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use nmo_webhook::config::Config;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    shared::telemetry::init_logging(config.runtime.zap_level);
    match nmo_webhook::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "nmo-webhook failed to start");
            ExitCode::FAILURE
        }
    }
}
