//! A small in-memory API server behind kube's `tower-test` mock service:
//! objects by path, resourceVersion checks on writes (409), JSON patches
//! with their `test` operations (422), pod lists by node, evictions (429
//! for a pod labelled `test/pdb=blocked`, as a PodDisruptionBudget says),
//! and every call recorded as "METHOD path".

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

pub const NM_PATH: &str = "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances/nm-1";
pub const NODE_PATH: &str = "/api/v1/nodes/worker-1";
pub const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases/node-worker-1";

/// The label that makes a pod's eviction answer as a blocking PDB does.
pub const PDB_BLOCKED: (&str, &str) = ("test/pdb", "blocked");

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    calls: Vec<String>,
    events: Vec<(String, String)>,
    version: u64,
    /// A Status (JSON) to answer every node patch with.
    refuse_node_patch: Option<String>,
    /// Answer patches of nodes/status with 403 (no RBAC for them).
    forbid_node_status: bool,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    client: Client,
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

impl FakeApi {
    /// Start answering; the server task ends with the last client.
    pub fn start() -> FakeApi {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let state = Arc::new(Mutex::new(State {
            version: 100,
            ..State::default()
        }));
        tokio::spawn(serve(handle, state.clone()));
        FakeApi {
            state,
            client: Client::new(service, "default"),
        }
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Store `obj` at `path` (a new resourceVersion unless it has one).
    pub fn put(&self, path: &str, mut obj: Value) {
        let mut st = self.state();
        if obj["metadata"]["resourceVersion"].is_null() {
            st.version += 1;
            obj["metadata"]["resourceVersion"] = json!(st.version.to_string());
        }
        st.objects.insert(path.to_string(), obj);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.state().objects.get(path).cloned()
    }

    /// Delete what is stored at `path` (as someone else would).
    pub fn remove(&self, path: &str) {
        self.state().objects.remove(path);
    }

    /// The NodeMaintenance as stored now.
    pub fn nm(&self) -> shared::NodeMaintenance {
        let obj = self.get(NM_PATH).unwrap_or(Value::Null);
        serde_json::from_value(obj).expect("the stored NodeMaintenance")
    }

    pub fn status(&self) -> Value {
        self.get(NM_PATH)
            .map(|o| o["status"].clone())
            .unwrap_or(Value::Null)
    }

    /// Every call so far as "METHOD path", and forget them.
    pub fn calls(&self) -> Vec<String> {
        std::mem::take(&mut self.state().calls)
    }

    /// Events posted so far as (type, reason), and forget them.
    pub fn events(&self) -> Vec<(String, String)> {
        std::mem::take(&mut self.state().events)
    }

    pub fn refuse_node_patches(&self, status: &str) {
        self.state().refuse_node_patch = Some(status.to_string());
    }

    /// Patches of nodes/status are forbidden from now on (403).
    pub fn forbid_node_status(&self) {
        self.state().forbid_node_status = true;
    }
}

/// A node for the tests, schedulable, untainted.
pub fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {}},
        "spec": {}})
}

/// A pod of a ReplicaSet on `node`.
pub fn pod(ns: &str, name: &str, node: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "rs-1", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"}})
}

pub fn pod_path(ns: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/pods/{name}")
}

/// The (status, reason) of condition `type_` in `status`.
pub fn condition(status: &Value, type_: &str) -> Option<(String, String)> {
    let c = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?;
    Some((
        c["status"].as_str()?.to_string(),
        c["reason"].as_str()?.to_string(),
    ))
}

async fn serve(mut handle: Handle, state: Arc<Mutex<State>>) {
    while let Some((req, reply)) = handle.next_request().await {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let content_type = |prefix: &[u8]| {
            parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(prefix))
        };
        let json_patch = content_type(b"application/json-patch");
        let strategic = content_type(b"application/strategic-merge-patch");
        let (code, answer) = {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            st.calls.push(format!("{} {path}", parts.method));
            let req = Req {
                method: parts.method.as_str(),
                path: &path,
                query: &query,
                body,
                json_patch,
                strategic,
            };
            st.answer(req)
        };
        let response = Response::builder()
            .status(code)
            .body(Body::from(answer.to_string().into_bytes()))
            .expect("a response");
        reply.send_response(response);
    }
}

struct Req<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    body: Value,
    json_patch: bool,
    /// A strategic merge patch: `status.conditions` merge by `type`.
    strategic: bool,
}

/// `status.conditions` of a strategic merge patch, merged by `type` as the
/// API server merges a Node's conditions.
fn merge_conditions(obj: &mut Value, patch: Value) {
    let Value::Array(patch) = patch else { return };
    let status = &mut obj["status"];
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    if let Some(current) = status["conditions"].as_array_mut() {
        for c in patch {
            match current.iter_mut().find(|o| o["type"] == c["type"]) {
                Some(o) => json_patch::merge(o, &c),
                None => current.push(c),
            }
        }
    }
}

/// The status of node condition `type_` (`"True"`, `"False"`), if any.
pub fn node_condition(node: &Value, type_: &str) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

fn failure(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": code, "reason": reason, "message": message}),
    )
}

fn success() -> (u16, Value) {
    (
        200,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    )
}

impl State {
    fn answer(&mut self, req: Req<'_>) -> (u16, Value) {
        match req.method {
            "GET" if req.path == "/api/v1/pods" => self.list_pods(req.query),
            "GET" => match self.objects.get(req.path) {
                Some(obj) => (200, obj.clone()),
                None => failure(404, "NotFound", &format!("{} not found", req.path)),
            },
            "PATCH" => self.patch(req),
            "PUT" => self.replace(req.path, req.body),
            "POST" if req.path.ends_with("/eviction") => self.evict(req.path),
            "POST" => self.create(req.path, req.body),
            "DELETE" => match self.objects.remove(req.path) {
                Some(_) => success(),
                None => failure(404, "NotFound", &format!("{} not found", req.path)),
            },
            other => failure(405, "MethodNotAllowed", other),
        }
    }

    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    fn list_pods(&self, query: &str) -> (u16, Value) {
        let node = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector=spec.nodeName%3D"))
            .unwrap_or_default();
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(p, o)| p.contains("/pods/") && o["spec"]["nodeName"] == node)
            .map(|(_, o)| o.clone())
            .collect();
        (
            200,
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}),
        )
    }

    fn patch(&mut self, req: Req<'_>) -> (u16, Value) {
        let target = req.path.strip_suffix("/status").unwrap_or(req.path);
        if target.starts_with("/api/v1/nodes/") {
            if self.forbid_node_status && req.path.ends_with("/status") {
                return failure(
                    403,
                    "Forbidden",
                    "nodes/status is forbidden: patch not granted",
                );
            }
            if let Some(refusal) = &self.refuse_node_patch {
                return (422, serde_json::from_str(refusal).unwrap_or(Value::Null));
            }
        }
        let Some(mut obj) = self.objects.get(target).cloned() else {
            return failure(404, "NotFound", &format!("{target} not found"));
        };
        let mut body = req.body;
        if req.json_patch {
            // As the API server's patch library: testing a missing path
            // for null succeeds.
            if let Value::Array(ops) = &mut body {
                ops.retain(|op| {
                    !(op["op"] == "test"
                        && op["value"].is_null()
                        && op["path"]
                            .as_str()
                            .is_some_and(|p| obj.pointer(p).is_none()))
                });
            }
            let Ok(patch) = serde_json::from_value::<json_patch::Patch>(body) else {
                return failure(400, "BadRequest", "not a JSON patch");
            };
            if json_patch::patch(&mut obj, &patch).is_err() {
                return failure(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                );
            }
        } else if req.strategic {
            let conditions = body["status"]
                .as_object_mut()
                .and_then(|st| st.remove("conditions"))
                .unwrap_or(Value::Null);
            merge_conditions(&mut obj, conditions);
            json_patch::merge(&mut obj, &body);
        } else {
            let wanted = body["metadata"]["resourceVersion"].take();
            if wanted.is_string() && wanted != obj["metadata"]["resourceVersion"] {
                return failure(409, "Conflict", "the object has been modified");
            }
            json_patch::merge(&mut obj, &body);
        }
        obj["metadata"]["resourceVersion"] = json!(self.next_version());
        self.objects.insert(target.to_string(), obj.clone());
        (200, obj)
    }

    fn replace(&mut self, path: &str, mut body: Value) -> (u16, Value) {
        let Some(old) = self.objects.get(path) else {
            return failure(404, "NotFound", &format!("{path} not found"));
        };
        if body["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
            return failure(409, "Conflict", "the object has been modified");
        }
        body["metadata"]["resourceVersion"] = json!(self.next_version());
        self.objects.insert(path.to_string(), body.clone());
        (200, body)
    }

    fn create(&mut self, collection: &str, mut body: Value) -> (u16, Value) {
        if collection.ends_with("/events") {
            let ev = (
                body["type"].as_str().unwrap_or_default().to_string(),
                body["reason"].as_str().unwrap_or_default().to_string(),
            );
            self.events.push(ev);
            return (201, body);
        }
        let name = body["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let path = format!("{collection}/{name}");
        if self.objects.contains_key(&path) {
            return failure(409, "AlreadyExists", &format!("{path} already exists"));
        }
        body["metadata"]["resourceVersion"] = json!(self.next_version());
        self.objects.insert(path, body.clone());
        (201, body)
    }

    fn evict(&mut self, path: &str) -> (u16, Value) {
        let pod_path = path.trim_end_matches("/eviction");
        let Some(pod) = self.objects.get(pod_path) else {
            return failure(404, "NotFound", "pod not found");
        };
        if pod["metadata"]["labels"][PDB_BLOCKED.0] == PDB_BLOCKED.1 {
            let (code, mut status) = failure(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            );
            status["details"] = json!({"causes": [{"reason": "DisruptionBudget",
                "message": "The disruption budget web needs 1 healthy pods and has 1 currently"}]});
            return (code, status);
        }
        self.objects.remove(pod_path);
        (
            201,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        )
    }
}
