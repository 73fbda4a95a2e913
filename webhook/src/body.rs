//! Reading a request body within limits, and knowing afterwards whether the
//! connection can carry another request.
//!
//! A server that answers before the client finished sending its body has two
//! honest choices: read (and discard) the rest, so the connection stays in
//! step and the client reads the answer, or say `Connection: close` and
//! close. Closing with unread bytes in the kernel's receive buffer makes the
//! kernel send a reset, which can destroy the answer before the client reads
//! it: a client then sees a dropped connection instead of a 413. So a body up
//! to [`DISCARD_FACTOR`] times the limit is read to its end and thrown away;
//! only a larger one (or one that stalls) closes the connection.

use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;

/// Over-limit bodies up to this many times the limit are read to the end
/// (and discarded) so the 413 reaches the client on a connection it can reuse.
pub const DISCARD_FACTOR: usize = 4;

/// What reading a body came to.
#[derive(Debug)]
pub enum Read {
    /// The whole body, within the limit.
    Complete(Bytes),
    /// Over the limit. `drained`: the rest was read and discarded, so the
    /// connection is still usable.
    TooLarge { drained: bool },
    /// Not received within the deadline (the connection is out of step).
    TimedOut,
    /// The transport failed while reading.
    Failed(String),
}

/// Read `body` completely if it fits in `limit` bytes, within `timeout`.
/// `declared` is the Content-Length, if the client sent one: a body declared
/// larger than the discard bound is not read at all.
pub async fn read(body: Body, declared: Option<u64>, limit: usize, timeout: Duration) -> Read {
    let bound = limit.saturating_mul(DISCARD_FACTOR) as u64;
    if declared.is_some_and(|n| n > bound) {
        return Read::TooLarge { drained: false };
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut body = body;
    let mut buf: Vec<u8> = Vec::new();
    let mut seen: u64 = 0;
    let mut over = false;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            // Past the limit already: the answer is 413 either way, but the
            // connection is out of step.
            Err(_) if over => return Read::TooLarge { drained: false },
            Err(_) => return Read::TimedOut,
            Ok(None) => break,
            Ok(Some(Err(e))) => return Read::Failed(e.to_string()),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        seen = seen.saturating_add(data.len() as u64);
        if seen > bound {
            return Read::TooLarge { drained: false };
        }
        if seen > limit as u64 {
            over = true;
            buf = Vec::new();
        }
        if !over {
            buf.extend_from_slice(&data);
        }
    }
    if over {
        Read::TooLarge { drained: true }
    } else {
        Read::Complete(Bytes::from(buf))
    }
}

/// Read and discard what is left of a body we answer without reading (an
/// unsupported content type, a busy server), so the connection stays in step.
/// True when the body ended within the bound and the deadline.
pub async fn discard(body: Body, limit: usize, timeout: Duration) -> bool {
    matches!(
        read(body, None, limit, timeout).await,
        Read::Complete(_) | Read::TooLarge { drained: true }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn chunks(parts: Vec<&'static [u8]>) -> Body {
        let stream = futures::stream::iter(
            parts
                .into_iter()
                .map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p))),
        );
        Body::from_stream(stream)
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_body_within_the_limit_is_returned_whole() {
        match read(chunks(vec![b"{\"a\":", b"1}"]), None, 10, T).await {
            Read::Complete(b) => assert_eq!(&b[..], b"{\"a\":1}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn exactly_the_limit_fits() {
        assert!(matches!(
            read(chunks(vec![b"12345"]), Some(5), 5, T).await,
            Read::Complete(_)
        ));
    }

    #[tokio::test]
    async fn over_the_limit_is_drained_up_to_the_bound() {
        // 12 bytes, limit 5: over, but within 4 x 5 = 20, so read to the end.
        assert!(matches!(
            read(chunks(vec![b"123456", b"789012"]), None, 5, T).await,
            Read::TooLarge { drained: true }
        ));
    }

    #[tokio::test]
    async fn beyond_the_bound_is_not_drained() {
        let parts: Vec<&'static [u8]> = vec![b"1234567890"; 3];
        assert!(matches!(
            read(chunks(parts), None, 5, T).await,
            Read::TooLarge { drained: false }
        ));
        // Declared beyond the bound: not read at all.
        assert!(matches!(
            read(chunks(vec![b"x"]), Some(21), 5, T).await,
            Read::TooLarge { drained: false }
        ));
    }

    #[tokio::test]
    async fn a_stalled_body_times_out() {
        let stream = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"{"))])
            .chain(futures::stream::pending());
        let body = Body::from_stream(stream);
        assert!(matches!(
            read(body, None, 5, Duration::from_millis(50)).await,
            Read::TimedOut
        ));
    }

    #[tokio::test]
    async fn over_the_limit_then_stalled_is_too_large_not_a_timeout() {
        let stream = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(
            b"1234567",
        ))])
        .chain(futures::stream::pending());
        assert!(matches!(
            read(
                Body::from_stream(stream),
                None,
                5,
                Duration::from_millis(50)
            )
            .await,
            Read::TooLarge { drained: false }
        ));
    }

    #[tokio::test]
    async fn discard_reports_whether_the_body_ended() {
        assert!(discard(chunks(vec![b"a=b"]), 5, T).await);
        let parts: Vec<&'static [u8]> = vec![b"1234567890"; 3];
        assert!(!discard(chunks(parts), 5, T).await);
    }
}
