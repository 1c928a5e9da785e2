//! The `log` records of dependencies, into `tracing`, with some demoted:
//! a record a dependency logs above what it tells an operator (Pingora
//! logs every failed TLS handshake of the public listener, a scanner's or
//! a client's that gave up, at ERROR) is passed on at DEBUG instead, so
//! `RUST_LOG` decides whether it is seen and an error log means an error.

use tracing_log::AsLog;

/// One kind of `log` record to pass on at DEBUG: its target and how its
/// message starts.
#[derive(Debug, Clone, Copy)]
pub struct Demoted {
    pub target: &'static str,
    pub message_prefix: &'static str,
}

/// `tracing_log::LogTracer` with [`Demoted`] rules in front.
struct DemotingLogger {
    inner: tracing_log::LogTracer,
    rules: Vec<Demoted>,
}

impl DemotingLogger {
    fn rule(&self, record: &log::Record<'_>) -> Option<&Demoted> {
        if record.level() >= log::Level::Debug {
            return None;
        }
        self.rules.iter().find(|r| record.target() == r.target)
    }
}

impl log::Log for DemotingLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if let Some(rule) = self.rule(record) {
            // Formatted once, only for the rules' targets (rare records).
            let text = record.args().to_string();
            if text.starts_with(rule.message_prefix) {
                self.inner.log(
                    &log::Record::builder()
                        .level(log::Level::Debug)
                        .target(record.target())
                        .module_path(record.module_path())
                        .file(record.file())
                        .line(record.line())
                        .args(format_args!("{text}"))
                        .build(),
                );
                return;
            }
        }
        self.inner.log(record);
    }

    fn flush(&self) {}
}

/// Routes `log` records into the global `tracing` subscriber (set before),
/// with `demoted` records at DEBUG.
pub(crate) fn install(demoted: &[Demoted]) -> anyhow::Result<()> {
    log::set_boxed_logger(Box::new(DemotingLogger {
        inner: tracing_log::LogTracer::new(),
        rules: demoted.to_vec(),
    }))?;
    // After the subscriber is set: its max level hint skips the records
    // nothing would show without formatting them.
    log::set_max_level(tracing::level_filters::LevelFilter::current().as_log());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Log;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Collects (level, target, message) of every event.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<(tracing::Level, String, String)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            use tracing_log::NormalizeEvent;
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            let meta = event.normalized_metadata();
            let meta = meta.as_ref().unwrap_or_else(|| event.metadata());
            if let Ok(mut seen) = self.0.lock() {
                seen.push((*meta.level(), meta.target().to_owned(), message.0));
            }
        }
    }

    /// An ERROR record of Pingora's listening service.
    fn error(logger: &DemotingLogger, message: std::fmt::Arguments<'_>) {
        logger.log(
            &log::Record::builder()
                .level(log::Level::Error)
                .target("pingora_core::services::listening")
                .args(message)
                .build(),
        );
    }

    #[test]
    fn a_handshake_failure_is_passed_on_at_debug_and_other_errors_stay() {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry().with(seen.clone());
        let logger = DemotingLogger {
            inner: tracing_log::LogTracer::new(),
            rules: vec![Demoted {
                target: "pingora_core::services::listening",
                message_prefix: "Downstream handshake",
            }],
        };
        tracing::subscriber::with_default(subscriber, || {
            error(
                &logger,
                format_args!("Downstream handshake error from 127.0.0.1:5: bad"),
            );
            error(&logger, format_args!("Accept() failed too many files"));
        });
        let seen = seen.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].0, tracing::Level::DEBUG, "{seen:?}");
        assert!(seen[0].2.contains("Downstream handshake error"), "{seen:?}");
        assert_eq!(seen[1].0, tracing::Level::ERROR, "{seen:?}");
    }
}
