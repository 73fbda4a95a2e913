//! Prometheus series declared once, as a table: [`series!`](crate::series!)
//! turns one line per series (field, kind, name, help, labels, buckets, the
//! label values that exist at zero from the start) into a struct holding
//! them, its constructor and the list of its collectors.
//!
//! ```ignore
//! shared::series! {
//!     /// The queue's series.
//!     struct Series(name: &str) {
//!         adds: IntCounterVec("workqueue_adds_total", "Total number of adds", ["name"],
//!             zero [[name]]),
//!         took: HistogramVec("workqueue_work_duration_seconds", "Processing time",
//!             ["name"], buckets = vec![0.1, 1.0], zero [[name]]),
//!     }
//! }
//! let s = Series::build("q")?;               // every series, zero-filled
//! s.register(&registry)?;                    // or s.collectors() in a Collector
//! ```
//!
//! The kinds are the `*Vec` types of the prometheus crate and the single
//! series `IntGauge` and `Histogram` (no labels: `[]`) ([`Family`]); the
//! constructor's parameters (`name: &str` above) are there for the `zero`
//! label values. A field may carry a visibility (`pub adds: ...`) for other
//! modules to reach it. Registration order does not matter: a registry renders its
//! families sorted by name.

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

#[doc(hidden)]
pub use prometheus::{Error, Registry, core::Collector};

/// A family of series that [`series!`](crate::series!) can declare: a
/// labelled `*Vec`, or a single series that takes no labels.
pub trait Family: Collector + Clone + Sized + 'static {
    /// The family `name` with `help` and `labels`; `buckets` only matter to
    /// histograms (empty: the prometheus crate's defaults).
    fn family(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> Result<Self, Error>;
}

impl Family for IntCounterVec {
    fn family(name: &str, help: &str, labels: &[&str], _: &[f64]) -> Result<Self, Error> {
        IntCounterVec::new(Opts::new(name, help), labels)
    }
}

impl Family for IntGaugeVec {
    fn family(name: &str, help: &str, labels: &[&str], _: &[f64]) -> Result<Self, Error> {
        IntGaugeVec::new(Opts::new(name, help), labels)
    }
}

impl Family for GaugeVec {
    fn family(name: &str, help: &str, labels: &[&str], _: &[f64]) -> Result<Self, Error> {
        GaugeVec::new(Opts::new(name, help), labels)
    }
}

impl Family for HistogramVec {
    fn family(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> Result<Self, Error> {
        HistogramVec::new(histogram_opts(name, help, buckets), labels)
    }
}

impl Family for IntGauge {
    fn family(name: &str, help: &str, labels: &[&str], _: &[f64]) -> Result<Self, Error> {
        no_labels(labels)?;
        IntGauge::with_opts(Opts::new(name, help))
    }
}

impl Family for Histogram {
    fn family(name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> Result<Self, Error> {
        no_labels(labels)?;
        Histogram::with_opts(histogram_opts(name, help, buckets))
    }
}

/// `buckets` when given, else the prometheus crate's defaults.
fn histogram_opts(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
    let opts = HistogramOpts::new(name, help);
    if buckets.is_empty() {
        opts
    } else {
        opts.buckets(buckets.to_vec())
    }
}

/// A single series takes no labels.
fn no_labels(labels: &[&str]) -> Result<(), Error> {
    match labels.len() {
        0 => Ok(()),
        got => Err(Error::InconsistentCardinality { expect: 0, got }),
    }
}

/// Declares a struct of series; see [the module](crate::serve::series).
#[macro_export]
macro_rules! series {
    (@buckets) => { &[] };
    (@buckets $buckets:expr) => { &$buckets };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident ($($arg:ident : $argty:ty),* $(,)?) {
            $(
                $(#[$fmeta:meta])*
                $fvis:vis $field:ident : $kind:ident ($metric:literal, $help:literal,
                    [$($label:literal),* $(,)?]
                    $(, buckets = $buckets:expr)?
                    $(, zero [$($zero:expr),* $(,)?])? $(,)?)
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $kind, )*
        }

        impl $name {
            /// Every series, with its zero-valued label sets in place.
            fn build($($arg: $argty),*) -> ::std::result::Result<Self, $crate::serve::series::Error> {
                let s = $name {
                    $(
                        $field: {
                            let buckets: &[f64] = $crate::series!(@buckets $($buckets)?);
                            <$kind as $crate::serve::series::Family>::family(
                                $metric, $help, &[$($label),*], buckets,
                            )?
                        },
                    )*
                };
                $( $( $( s.$field.with_label_values(&$zero); )* )? )*
                Ok(s)
            }

            /// The collectors, in declaration order.
            #[allow(dead_code)]
            fn collectors(&self) -> ::std::vec::Vec<&dyn $crate::serve::series::Collector> {
                ::std::vec![$(&self.$field),*]
            }

            /// Register every series with `registry`.
            #[allow(dead_code)]
            fn register(
                &self,
                registry: &$crate::serve::series::Registry,
            ) -> ::std::result::Result<(), $crate::serve::series::Error> {
                $( registry.register(::std::boxed::Box::new(self.$field.clone()))?; )*
                Ok(())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use prometheus::{GaugeVec, Histogram, HistogramVec, IntCounterVec, IntGauge};

    crate::series! {
        /// Two series of a demo.
        struct Demo(who: &str) {
            /// Counted.
            hits: IntCounterVec("demo_hits_total", "Hits by who and how", ["who", "how"],
                zero [[who, "a"], [who, "b"]]),
            took: HistogramVec("demo_seconds", "Time taken", ["who"],
                buckets = [0.5, 2.0], zero [[who]]),
            level: GaugeVec("demo_level", "Not zero-filled", ["who"]),
        }
    }

    crate::series! {
        /// Single series, one reachable from other modules.
        struct Single() {
            pub up: IntGauge("single_up", "Up", []),
            took: Histogram("single_seconds", "Time taken", [], buckets = [1.0]),
        }
    }

    crate::series! {
        struct Mislabelled() {
            up: IntGauge("mislabelled_up", "Up", ["who"]),
        }
    }

    fn render(r: &prometheus::Registry) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&r.gather(), &mut out)
            .expect("encode");
        out
    }

    #[test]
    fn a_table_declares_builds_zero_fills_and_registers() {
        let d = Demo::build("me").expect("build");
        assert_eq!(d.collectors().len(), 3);
        let r = prometheus::Registry::new();
        d.register(&r).expect("register");
        d.level.with_label_values(&["you"]).set(1.5);
        d.hits.with_label_values(&["me", "a"]).inc();
        let want = r#"# HELP demo_hits_total Hits by who and how
# TYPE demo_hits_total counter
demo_hits_total{how="a",who="me"} 1
demo_hits_total{how="b",who="me"} 0
# HELP demo_level Not zero-filled
# TYPE demo_level gauge
demo_level{who="you"} 1.5
# HELP demo_seconds Time taken
# TYPE demo_seconds histogram
demo_seconds_bucket{who="me",le="0.5"} 0
demo_seconds_bucket{who="me",le="2"} 0
demo_seconds_bucket{who="me",le="+Inf"} 0
demo_seconds_sum{who="me"} 0
demo_seconds_count{who="me"} 0
"#;
        assert_eq!(render(&r), want);
        assert!(d.register(&r).is_err(), "a family registers once");
    }

    #[test]
    fn single_series_take_no_labels() {
        let s = Single::build().expect("build");
        let r = prometheus::Registry::new();
        s.register(&r).expect("register");
        s.up.set(1);
        s.took.observe(0.5);
        let want = r#"# HELP single_seconds Time taken
# TYPE single_seconds histogram
single_seconds_bucket{le="1"} 1
single_seconds_bucket{le="+Inf"} 1
single_seconds_sum 0.5
single_seconds_count 1
# HELP single_up Up
# TYPE single_up gauge
single_up 1
"#;
        assert_eq!(render(&r), want);
        assert!(Mislabelled::build().is_err(), "labels on a single series");
    }
}
