//! The object store behind the stand-in: one global, increasing resourceVersion; an event log
//! for watches (compactable, for 410 Gone); finalizers, deletionTimestamp and owner-reference
//! garbage collection with Orphan/Background/Foreground propagation; status-subresource and
//! generation rules; schema admission for custom resources.

use super::resources::{ResourceType, RESOURCES};
use super::schema;
use super::selectors::{FieldSelector, LabelSelector};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::broadcast;

pub type Key = (usize, String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub resource: usize,
    pub namespace: String,
    pub kind: EventType,
    pub object: Value,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }
    fn not_found(res: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{}.{} \"{name}\" not found", res.plural, res.group).replace(". \"", " \""),
        )
    }
    pub fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Orphan,
    Background,
    Foreground,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation: Option<Propagation>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub grace_period: Option<i64>,
}

pub enum Deleted {
    /// Gone from the store.
    Gone(Value),
    /// Still there, with a deletionTimestamp, until finalizers or the kubelet finish it.
    Pending(Value),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

#[derive(Clone)]
pub struct WatchFilter {
    pub resource: usize,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchFilter {
    pub fn matches_object(&self, resource: usize, namespace: &str, object: &Value) -> bool {
        resource == self.resource
            && self.namespace.as_deref().is_none_or(|ns| ns == namespace)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }
}

/// Events to replay, then a receiver for what follows.
pub type WatchStart = (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>);

const LOG_CAPACITY: usize = 200_000;

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    log: VecDeque<Arc<Event>>,
    /// Events with resourceVersion at or below this are no longer in the log.
    compacted_through: u64,
}

pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
    schemas: HashMap<usize, Value>,
}

pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub fn random_suffix(len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..len)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn new_uid() -> String {
    let v = rand::random::<u128>();
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn rv_of(object: &Value) -> Option<&str> {
    object["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
}

fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Everything but metadata and status: what `generation` counts changes of.
fn spec_part(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        for key in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(key);
        }
    }
    copy
}

const FOREGROUND: &str = "foregroundDeletion";
const ORPHAN: &str = "orphan";

impl Store {
    pub fn new(schemas: HashMap<usize, Value>) -> Self {
        let (events, _) = broadcast::channel(65_536);
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: BTreeMap::new(),
                log: VecDeque::new(),
                compacted_through: 0,
            }),
            events,
            schemas,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn object_count(&self) -> usize {
        self.lock().objects.len()
    }

    /// Drops the whole event log: watches from any older resourceVersion get 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.log.clear();
        inner.compacted_through = inner.rv;
    }

    pub fn get(&self, key: &Key) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&RESOURCES[key.0], &key.2))
    }

    pub fn list(&self, filter: &WatchFilter) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .range((filter.resource, String::new(), String::new())..)
            .take_while(|((r, _, _), _)| *r == filter.resource)
            .filter(|((r, ns, _), obj)| filter.matches_object(*r, ns, obj))
            .map(|(_, obj)| obj.clone())
            .collect();
        (items, inner.rv)
    }

    /// For a watch: the events to replay after `from` (or synthetic ADDED events for the
    /// current state when `from` is None), plus a receiver for what follows. Taken under the
    /// store lock, so nothing falls between replay and live events.
    pub fn watch(&self, filter: &WatchFilter, from: Option<u64>) -> Result<WatchStart, ApiError> {
        let inner = self.lock();
        let receiver = self.events.subscribe();
        let replay = match from {
            Some(rv) if rv < inner.compacted_through => {
                return Err(ApiError::new(
                    410,
                    "Expired",
                    format!(
                        "too old resource version: {rv} ({})",
                        inner.compacted_through + 1
                    ),
                ));
            }
            Some(rv) => inner
                .log
                .iter()
                .filter(|e| e.rv > rv && filter.matches_object(e.resource, &e.namespace, &e.object))
                .cloned()
                .collect(),
            None => inner
                .objects
                .iter()
                .filter(|((r, ns, _), obj)| filter.matches_object(*r, ns, obj))
                .map(|((r, ns, _), obj)| {
                    Arc::new(Event {
                        rv: rv_of(obj).and_then(|s| s.parse().ok()).unwrap_or(0),
                        resource: *r,
                        namespace: ns.clone(),
                        kind: EventType::Added,
                        object: obj.clone(),
                    })
                })
                .collect(),
        };
        Ok((replay, receiver))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    /// Stores `object` under `key` (or removes it) with a new resourceVersion, and tells the
    /// watchers.
    fn commit(&self, inner: &mut Inner, key: &Key, mut object: Value, kind: EventType) -> Value {
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        match kind {
            EventType::Deleted => {
                inner.objects.remove(key);
            }
            _ => {
                inner.objects.insert(key.clone(), object.clone());
            }
        }
        let event = Arc::new(Event {
            rv,
            resource: key.0,
            namespace: key.1.clone(),
            kind,
            object: object.clone(),
        });
        inner.log.push_back(Arc::clone(&event));
        if inner.log.len() > LOG_CAPACITY {
            if let Some(dropped) = inner.log.pop_front() {
                inner.compacted_through = dropped.rv;
            }
        }
        let _ = self.events.send(event);
        object
    }

    fn admit(
        &self,
        resource: usize,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(schema) = self.schemas.get(&resource) else {
            return Ok(());
        };
        schema::admit(schema, object, old).map_err(|problems| {
            let res = &RESOURCES[resource];
            let name = object["metadata"]["name"].as_str().unwrap_or("");
            ApiError::new(
                422,
                "Invalid",
                format!(
                    "{}.{} \"{name}\" is invalid: {}",
                    res.kind,
                    res.group,
                    problems.join(", ")
                ),
            )
        })
    }

    pub fn create(
        &self,
        resource: usize,
        namespace: &str,
        mut object: Value,
    ) -> Result<Value, ApiError> {
        let res = &RESOURCES[resource];
        if !object.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the body must be an object",
            ));
        }
        let mut inner = self.lock();
        let name = match object["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => match object["metadata"]["generateName"].as_str() {
                Some(prefix) => loop {
                    let candidate = format!("{prefix}{}", random_suffix(5));
                    if !inner.objects.contains_key(&(resource, namespace.to_string(), candidate.clone())) {
                        break candidate;
                    }
                },
                None => return Err(ApiError::new(422, "Invalid", format!("{} \"\" is invalid: metadata.name: Required value: name or generateName is required", res.kind))),
            },
        };
        let ns = if res.namespaced {
            namespace.to_string()
        } else {
            String::new()
        };
        if let Some(body_ns) = object["metadata"]["namespace"].as_str() {
            if res.namespaced && !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::new(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request"));
            }
        }
        let key = (resource, ns.clone(), name.clone());
        if inner.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{}.{} \"{name}\" already exists", res.plural, res.group)
                    .replace(". \"", " \""),
            ));
        }
        object["apiVersion"] = Value::String(res.api_version());
        object["kind"] = Value::String(res.kind.to_string());
        let meta = &mut object["metadata"];
        meta["name"] = Value::String(name);
        if res.namespaced {
            meta["namespace"] = Value::String(ns);
        }
        meta["uid"] = Value::String(new_uid());
        meta["creationTimestamp"] = Value::String(now_rfc3339());
        meta["generation"] = json!(1);
        if let Some(m) = meta.as_object_mut() {
            m.remove("deletionTimestamp");
            m.remove("resourceVersion");
        }
        if res.status {
            if let Some(map) = object.as_object_mut() {
                map.remove("status");
            }
        }
        self.admit(resource, &mut object, None)?;
        Ok(self.commit(&mut inner, &key, object, EventType::Added))
    }

    /// PUT semantics. With `Sub::Status` only the status is taken from `object`; otherwise
    /// everything but the status (for types with a status subresource).
    pub fn update(&self, key: &Key, object: Value, sub: Sub) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        self.update_locked(&mut inner, key, object, sub)
    }

    fn update_locked(
        &self,
        inner: &mut Inner,
        key: &Key,
        mut object: Value,
        sub: Sub,
    ) -> Result<Value, ApiError> {
        let res = &RESOURCES[key.0];
        let old = inner
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, &key.2))?;
        if let Some(rv) = rv_of(&object) {
            if Some(rv) != rv_of(&old) {
                return Err(ApiError::new(409, "Conflict", format!(
                    "Operation cannot be fulfilled on {}.{} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                    res.plural, res.group, key.2)));
            }
        }
        if let Some(name) = object["metadata"]["name"].as_str() {
            if name != key.2 {
                return Err(ApiError::new(
                    400,
                    "BadRequest",
                    "the name of the object does not match the name on the URL",
                ));
            }
        }
        let mut next = match sub {
            Sub::Status => {
                let mut next = old.clone();
                next["status"] = object.get("status").cloned().unwrap_or(Value::Null);
                if next["status"].is_null() {
                    if let Some(m) = next.as_object_mut() {
                        m.remove("status");
                    }
                }
                next
            }
            Sub::Main => {
                if res.status {
                    match old.get("status") {
                        Some(status) => object["status"] = status.clone(),
                        None => {
                            if let Some(m) = object.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                // Fields the server owns.
                for field in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ] {
                    match old["metadata"].get(field) {
                        Some(v) => object["metadata"][field] = v.clone(),
                        None => {
                            if let Some(m) = object["metadata"].as_object_mut() {
                                m.remove(field);
                            }
                        }
                    }
                }
                object["metadata"]["name"] = old["metadata"]["name"].clone();
                if res.namespaced {
                    object["metadata"]["namespace"] = old["metadata"]["namespace"].clone();
                }
                object["apiVersion"] = old["apiVersion"].clone();
                object["kind"] = old["kind"].clone();
                object
            }
        };
        if spec_part(&next) != spec_part(&old) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(generation + 1);
        }
        self.admit(key.0, &mut next, Some(&old))?;
        next["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if next == old {
            return Ok(old); // a no-op write changes nothing, not even the resourceVersion
        }
        let deleting = next["metadata"].get("deletionTimestamp").is_some();
        if deleting && finalizers(&next).is_empty() {
            return Ok(self.remove_locked(inner, key, next));
        }
        let stored = self.commit(inner, key, next, EventType::Modified);
        Ok(stored)
    }

    pub fn patch(
        &self,
        key: &Key,
        kind: PatchKind,
        patch: &Value,
        sub: Sub,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let current = match inner.objects.get(key).cloned() {
            Some(current) => current,
            None if kind == PatchKind::Apply && sub == Sub::Main => {
                drop(inner);
                let mut object = patch.clone();
                object["metadata"]["name"] = Value::String(key.2.clone());
                return self.create(key.0, &key.1, object);
            }
            None => return Err(ApiError::not_found(&RESOURCES[key.0], &key.2)),
        };
        let mut target = current.clone();
        match kind {
            PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply => {
                json_patch::merge(&mut target, patch)
            }
            PatchKind::Json => {
                let operations: json_patch::Patch =
                    serde_json::from_value(patch.clone()).map_err(|e| {
                        ApiError::new(400, "BadRequest", format!("invalid JSON patch: {e}"))
                    })?;
                json_patch::patch(&mut target, &operations).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the JSON patch could not be applied: {e}"),
                    )
                })?;
            }
        }
        self.update_locked(&mut inner, key, target, sub)
    }

    pub fn delete(&self, key: &Key, options: &DeleteOptions) -> Result<Deleted, ApiError> {
        let mut inner = self.lock();
        let res = &RESOURCES[key.0];
        let object = inner
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, &key.2))?;
        let conflict = |what: &str| {
            ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {}.{} \"{}\": Precondition failed: {what}",
                    res.plural, res.group, key.2
                ),
            )
        };
        if let Some(uid) = &options.uid {
            if object["metadata"]["uid"].as_str() != Some(uid.as_str()) {
                return Err(conflict("UID in precondition does not match the object's"));
            }
        }
        if let Some(rv) = &options.resource_version {
            if rv_of(&object) != Some(rv.as_str()) {
                return Err(conflict(
                    "ResourceVersion in precondition does not match the object's",
                ));
            }
        }
        let default_policy = if res.group == "batch" && res.plural == "jobs" {
            Propagation::Orphan
        } else {
            Propagation::Background
        };
        let policy = options.propagation.unwrap_or(default_policy);
        let mut next = object.clone();
        let mut fins = finalizers(&next);
        match policy {
            Propagation::Foreground if !fins.iter().any(|f| f == FOREGROUND) => {
                fins.push(FOREGROUND.into())
            }
            Propagation::Orphan
                if !fins.iter().any(|f| f == ORPHAN) && self.has_dependents(&inner, &object) =>
            {
                fins.push(ORPHAN.into());
            }
            _ => {}
        }
        let graceful_pod =
            res.kind == "Pod" && res.group.is_empty() && options.grace_period != Some(0);
        let already_deleting = next["metadata"].get("deletionTimestamp").is_some();
        if fins.is_empty() && !graceful_pod {
            let gone = self.remove_locked(&mut inner, key, next);
            return Ok(Deleted::Gone(gone));
        }
        if !already_deleting {
            next["metadata"]["deletionTimestamp"] = Value::String(now_rfc3339());
            let grace = options
                .grace_period
                .or_else(|| object["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(if graceful_pod { 30 } else { 0 });
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        }
        next["metadata"]["finalizers"] = json!(fins);
        let stored = self.commit(&mut inner, key, next, EventType::Modified);
        match policy {
            Propagation::Foreground => {
                self.delete_dependents(&mut inner, &stored);
                self.finish_foreground(&mut inner, key);
            }
            Propagation::Orphan => {
                self.orphan_dependents(&mut inner, &stored);
                self.drop_finalizer(&mut inner, key, ORPHAN);
            }
            Propagation::Background => {}
        }
        Ok(match inner.objects.get(key) {
            Some(obj) => Deleted::Pending(obj.clone()),
            None => Deleted::Gone(stored),
        })
    }

    /// Removes a pod whose process has ended (the kubelet's final, grace-0 delete).
    pub fn remove_now(&self, key: &Key) {
        let mut inner = self.lock();
        if let Some(object) = inner.objects.get(key).cloned() {
            self.remove_locked(&mut inner, key, object);
        }
    }

    fn remove_locked(&self, inner: &mut Inner, key: &Key, object: Value) -> Value {
        let gone = self.commit(inner, key, object, EventType::Deleted);
        // Background propagation: dependents of a removed owner go too.
        self.delete_dependents(inner, &gone);
        // An owner waiting in foreground deletion may now be free to go.
        for owner in self.owners_of(inner, &gone) {
            self.finish_foreground(inner, &owner);
        }
        gone
    }

    fn dependents_of(&self, inner: &Inner, owner: &Value) -> Vec<Key> {
        let Some(uid) = owner["metadata"]["uid"].as_str() else {
            return Vec::new();
        };
        inner
            .objects
            .iter()
            .filter(|(_, obj)| {
                obj["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn has_dependents(&self, inner: &Inner, owner: &Value) -> bool {
        !self.dependents_of(inner, owner).is_empty()
    }

    fn owners_of(&self, inner: &Inner, object: &Value) -> Vec<Key> {
        let uids: Vec<&str> = object["metadata"]["ownerReferences"]
            .as_array()
            .map(|refs| refs.iter().filter_map(|r| r["uid"].as_str()).collect())
            .unwrap_or_default();
        inner
            .objects
            .iter()
            .filter(|(_, obj)| {
                obj["metadata"]["uid"]
                    .as_str()
                    .is_some_and(|u| uids.contains(&u))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn delete_dependents(&self, inner: &mut Inner, owner: &Value) {
        for dependent in self.dependents_of(inner, owner) {
            let Some(object) = inner.objects.get(&dependent).cloned() else {
                continue;
            };
            if object["metadata"].get("deletionTimestamp").is_some() {
                continue;
            }
            let res = &RESOURCES[dependent.0];
            let is_pod = res.kind == "Pod" && res.group.is_empty();
            if is_pod || !finalizers(&object).is_empty() {
                // Graceful: the kubelet (pods) or the finalizers' owners finish it.
                let mut next = object.clone();
                next["metadata"]["deletionTimestamp"] = Value::String(now_rfc3339());
                let grace = object["spec"]["terminationGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(30);
                next["metadata"]["deletionGracePeriodSeconds"] =
                    json!(if is_pod { grace } else { 0 });
                self.commit(inner, &dependent, next, EventType::Modified);
            } else {
                self.remove_locked(inner, &dependent, object);
            }
        }
    }

    fn orphan_dependents(&self, inner: &mut Inner, owner: &Value) {
        let Some(uid) = owner["metadata"]["uid"].as_str().map(String::from) else {
            return;
        };
        for dependent in self.dependents_of(inner, owner) {
            let Some(mut object) = inner.objects.get(&dependent).cloned() else {
                continue;
            };
            if let Some(refs) = object["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
            }
            self.commit(inner, &dependent, object, EventType::Modified);
        }
    }

    fn finish_foreground(&self, inner: &mut Inner, key: &Key) {
        let Some(object) = inner.objects.get(key).cloned() else {
            return;
        };
        if finalizers(&object).iter().any(|f| f == FOREGROUND)
            && !self.has_dependents(inner, &object)
        {
            self.drop_finalizer(inner, key, FOREGROUND);
        }
    }

    fn drop_finalizer(&self, inner: &mut Inner, key: &Key, finalizer: &str) {
        let Some(mut object) = inner.objects.get(key).cloned() else {
            return;
        };
        let remaining: Vec<String> = finalizers(&object)
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        object["metadata"]["finalizers"] = json!(remaining);
        if remaining.is_empty() && object["metadata"].get("deletionTimestamp").is_some() {
            let is_pod = RESOURCES[key.0].kind == "Pod";
            if !is_pod {
                self.remove_locked(inner, key, object);
                return;
            }
        }
        self.commit(inner, key, object, EventType::Modified);
    }

    /// The objects of one resource type that `keep` accepts (for the kubelet). Only those are
    /// cloned: with thousands of finished Jobs and pods, cloning all of them on every pass
    /// was what kept the stand-in's cores busy.
    pub fn select(&self, resource: usize, keep: impl Fn(&Value) -> bool) -> Vec<(Key, Value)> {
        self.lock()
            .objects
            .range((resource, String::new(), String::new())..)
            .take_while(|((r, _, _), _)| *r == resource)
            .filter(|(_, v)| keep(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}
