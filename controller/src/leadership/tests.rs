//! The election loop against a mocked API server (kube's `tower-test`), on
//! tokio's paused clock: each scenario answers the loop's requests one by
//! one and checks what it asked and when leadership changed.

use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use kube::client::Body;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::decide::Timing;
use super::elect::Elector;

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/nmo-system/leases/135b1886.medik8s.io";

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

struct Run {
    handle: Handle,
    leading: watch::Receiver<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    start: Instant,
}

fn start() -> Run {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let (tx, leading) = watch::channel(false);
    let stop = CancellationToken::new();
    let elector = Elector {
        api: Api::<Lease>::namespaced(client, "nmo-system"),
        name: "135b1886.medik8s.io".into(),
        identity: "me".into(),
        timing: Timing::DEFAULT,
    };
    let task = tokio::spawn(elector.run(tx, stop.clone()));
    Run {
        handle,
        leading,
        stop,
        task,
        start: Instant::now(),
    }
}

fn lease(holder: &str, rv: &str, renew: &str, transitions: i32) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "135b1886.medik8s.io", "namespace": "nmo-system", "resourceVersion": rv},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
            "renewTime": renew, "leaseTransitions": transitions}})
}

fn status(code: u16) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
        "reason": reason, "message": "test"})
}

impl Run {
    /// The next request as (method, path, body); answered with `code` and `answer`.
    async fn answer(&mut self, code: u16, answer: Value) -> (String, String, Value) {
        let (req, reply) =
            tokio::time::timeout(Duration::from_secs(600), self.handle.next_request())
                .await
                .ok()
                .flatten()
                .expect("the loop makes another request");
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let response = Response::builder()
            .status(code)
            .body(Body::from(answer.to_string().into_bytes()));
        reply.send_response(response.expect("a response"));
        (parts.method.to_string(), parts.uri.path().to_string(), body)
    }

    /// Create the Lease (GET 404, POST 201): leading.
    async fn win_by_creating(&mut self) {
        let (m, p, _) = self.answer(404, status(404)).await;
        assert_eq!((m.as_str(), p.as_str()), ("GET", PATH));
        let (m, _, body) = self
            .answer(201, lease("me", "1", "2026-12-06T00:00:00.000000Z", 0))
            .await;
        assert_eq!(m, "POST");
        assert_eq!(body["spec"]["holderIdentity"], "me");
        assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
        assert_eq!(body["spec"]["leaseTransitions"], 0);
        self.leading
            .changed()
            .await
            .expect("a change of leadership");
        assert!(*self.leading.borrow(), "leading once the Lease is created");
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_renews_every_retry_period_guarded_by_resource_version_and_releases_on_stop() {
    let mut run = start();
    run.win_by_creating().await;
    for (i, rv) in ["1", "2", "3"].into_iter().enumerate() {
        let (m, _, _) = run
            .answer(200, lease("me", rv, "2026-12-06T00:00:00.000000Z", 0))
            .await;
        assert_eq!(m, "GET");
        let at = run.start.elapsed();
        let want = Duration::from_secs(2 * (i as u64 + 1));
        assert!(
            at >= want && at < want + Duration::from_millis(100),
            "renewal {i} at {at:?}, want {want:?}"
        );
        let (m, _, body) = run
            .answer(200, lease("me", rv, "2026-12-06T00:00:02.000000Z", 0))
            .await;
        assert_eq!(m, "PATCH");
        assert_eq!(
            body["metadata"]["resourceVersion"], rv,
            "guarded by the version read: {body}"
        );
        assert_eq!(body["spec"]["holderIdentity"], "me");
    }
    run.stop.cancel();
    run.answer(200, lease("me", "4", "2026-12-06T00:00:06.000000Z", 0))
        .await;
    let (m, _, body) = run
        .answer(200, lease("", "5", "2026-12-06T00:00:06.000000Z", 0))
        .await;
    assert_eq!(m, "PATCH");
    assert_eq!(body["spec"]["holderIdentity"], "", "released: {body}");
    assert_eq!(body["spec"]["leaseDurationSeconds"], 1);
    run.task.await.expect("the loop ends after the release");
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_fail_or_hang_gives_up_at_its_renew_deadline_and_not_before() {
    let mut run = start();
    run.win_by_creating().await;
    let won = run.start.elapsed();
    // Renewals fail (500) twice, then the API server stops answering at all.
    run.answer(500, status(500)).await;
    run.answer(500, status(500)).await;
    let hung = tokio::time::timeout(Duration::from_secs(600), run.handle.next_request()).await;
    assert!(
        *run.leading.borrow(),
        "still leading while renewals fail within the deadline"
    );
    let _keep_hanging = hung.ok().flatten().expect("a third renewal");
    run.leading.changed().await.expect("leadership given up");
    assert!(!*run.leading.borrow());
    let after = run.start.elapsed() - won;
    assert!(
        after >= Duration::from_secs(10) && after < Duration::from_millis(10_100),
        "given up {after:?} after the last renewal; the renew deadline is 10 s"
    );
    run.task
        .await
        .expect("the loop ends: the process exits on a lost leadership");
}

#[tokio::test(start_paused = true)]
async fn a_standby_waits_out_an_unchanged_foreign_lease_then_takes_it_over_as_a_new_term() {
    let mut run = start();
    let foreign = lease("other", "7", "2026-12-06T00:00:00.000000Z", 3);
    loop {
        let (m, _, body) = run.answer(200, foreign.clone()).await;
        if m == "GET" {
            assert!(
                !*run.leading.borrow(),
                "leading while another holds the Lease"
            );
            continue;
        }
        assert_eq!(m, "PATCH");
        let at = run.start.elapsed();
        assert!(
            at >= Duration::from_secs(15) && at < Duration::from_secs(18),
            "taken over at {at:?}"
        );
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["spec"]["holderIdentity"], "me");
        assert_eq!(body["spec"]["leaseTransitions"], 4, "a new term: {body}");
        break;
    }
    run.leading.changed().await.expect("leading");
    assert!(*run.leading.borrow());
}

#[tokio::test(start_paused = true)]
async fn a_standby_never_takes_a_lease_its_holder_keeps_renewing_and_a_conflict_on_renewal_is_no_loss()
 {
    let mut run = start();
    for i in 0..30 {
        let renew = format!("2026-12-06T00:00:{:02}.000000Z", i * 2);
        let (m, _, _) = run
            .answer(200, lease("other", &i.to_string(), &renew, 3))
            .await;
        assert_eq!(m, "GET", "look {i}: only reads while the holder renews");
    }
    assert!(run.start.elapsed() >= Duration::from_secs(58));
    // The holder stops renewing: 15 s later the standby takes over.
    loop {
        let (m, _, _) = run
            .answer(200, lease("other", "29", "2026-12-06T00:00:58.000000Z", 3))
            .await;
        if m == "PATCH" {
            break;
        }
    }
    // Ours now; a renewal that meets a write in between (409) looks again.
    run.leading.changed().await.expect("leading");
    let (m, _, _) = run
        .answer(200, lease("me", "30", "2026-12-06T00:01:15.000000Z", 4))
        .await;
    assert_eq!(m, "GET");
    let (m, _, _) = run.answer(409, status(409)).await;
    assert_eq!(m, "PATCH");
    assert!(
        *run.leading.borrow(),
        "a conflict on a renewal is looked at again, not a loss"
    );
    let (m, _, _) = run
        .answer(200, lease("me", "31", "2026-12-06T00:01:16.000000Z", 4))
        .await;
    assert_eq!(m, "GET");
}
