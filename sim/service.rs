//! Simulated external services: an HTTP-like endpoint on a node of its own (`svc-{name}`), reached
//! over the simulated network, that records every effect it performs with the caller's idempotency key, so that a
//! handler which performs an effect twice (charges a card twice) is caught by the `external_exactly_once`
//! checker ([`super::checkers::external`]).
//!
//! A handler gets a [`ServiceClient`] from its replica ([`ReplicaCx::service`](super::user::ReplicaCx::service))
//! and calls it from its `process` phase with an [`EffectRequest`]: the effect's *subject* (what must happen at
//! most once: `charge line 17`) and, normally, an idempotency key. The service performs an effect per request,
//! except that a request whose idempotency key it has seen before returns the first effect's receipt and
//! performs nothing (the way payment APIs dedupe on an `Idempotency-Key` header). While the scenario's faults are
//! on, the service is slow, fails now and then *before* performing anything, and loses replies *after*
//! performing the effect (the caller cannot tell a lost reply from a failure: its call times out); after the heal
//! it answers every call, so a world whose handlers retry converges.
//!
//! Every request is a datagram to the service node and every reply one back; both cross the simulated network
//! like the store's calls (latency, partitions of the caller's node). Every effect is a trace line `effect` on
//! the service's node: `service=… subject=… key=… caller=… applied=true|false`.

use super::rng;
use super::trace::Trace;
use madsim::net::Endpoint;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The port every service listens on.
pub const SERVICE_PORT: u16 = 8080;
/// Tag of request datagrams.
const TAG_REQUEST: u64 = 1;
/// Most services one scenario may have: they get the addresses 10.0.3.1 to 10.0.3.200.
pub const SERVICES_MAX: usize = 200;
/// Longest subject or idempotency key a request may carry, in bytes (a bound on what the log keeps per effect).
pub const REQUEST_TEXT_LEN_MAX: usize = 256;

/// How a simulated service behaves. Every field has a default ([`ServiceOptions::default`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceOptions {
    /// Time the service takes to handle one request, drawn uniformly (simulated time; default 1–20 ms). A
    /// latency range past the callers' time-out makes every call time out.
    pub latency: Range<Duration>,
    /// While faults are on: chance that a request fails before any effect (the caller gets
    /// [`ServiceError::Failed`]). Default 0.05.
    pub failure_chance: f64,
    /// While faults are on: chance that the reply to a request that performed its effect is lost (the caller's
    /// call times out: it cannot tell this from a failure). Default 0.05.
    pub lost_reply_chance: f64,
    /// How long a [`ServiceClient::call`] waits for its reply (simulated time; default 1 s).
    pub call_timeout: Duration,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            latency: Duration::from_millis(1)..Duration::from_millis(20),
            failure_chance: 0.05,
            lost_reply_chance: 0.05,
            call_timeout: Duration::from_secs(1),
        }
    }
}

impl ServiceOptions {
    /// Checks the options of the service `name`. Errors name the field and the rule.
    pub fn check(&self, name: &str) -> Result<(), String> {
        let chance = |field: &str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(format!("service {name}: {field}: {value} is not a chance in 0..=1"))
            }
        };
        chance("failure_chance", self.failure_chance)?;
        chance("lost_reply_chance", self.lost_reply_chance)?;
        if self.latency.start > self.latency.end {
            return Err(format!("service {name}: latency: {:?} ends before it starts", self.latency));
        }
        if self.call_timeout.is_zero() {
            return Err(format!("service {name}: call_timeout must not be zero"));
        }
        Ok(())
    }
}

/// One request to a service: what must happen at most once, and the key that makes a retry safe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectRequest {
    /// What the effect is about, the unit of exactly-once (`charge line 17`): the `external_exactly_once` checker
    /// fails a run in which two effects with one subject were performed. At most [`REQUEST_TEXT_LEN_MAX`] bytes.
    pub subject: String,
    /// The caller's idempotency key: a request with a key the service has seen performs nothing and returns the
    /// first effect's receipt. `None` performs an effect every time (the planted bug of the example crate). At
    /// most [`REQUEST_TEXT_LEN_MAX`] bytes.
    pub idempotency_key: Option<String>,
}

impl EffectRequest {
    /// A request about `subject` with the idempotency key `key`.
    pub fn keyed(subject: impl Into<String>, key: impl Into<String>) -> EffectRequest {
        EffectRequest { subject: subject.into(), idempotency_key: Some(key.into()) }
    }
}

/// What a service answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EffectReceipt {
    /// The effect's number at the service (from 1), the first one's for a replayed idempotency key.
    pub effect: u64,
    /// Whether the request replayed an idempotency key (nothing was performed this time).
    pub replayed: bool,
}

/// Why a call to a service has no receipt.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// No reply within the call time-out: the effect may or may not have been performed.
    #[error("service {service}: no reply within {timeout:?} (the effect may have been performed)")]
    Timeout {
        /// The service.
        service: String,
        /// The call time-out.
        timeout: Duration,
    },
    /// The service refused the request; nothing was performed.
    #[error("service {service}: request failed: {message}")]
    Failed {
        /// The service.
        service: String,
        /// Why.
        message: String,
    },
    /// The request is not one the service takes (a subject or key too long); nothing was sent.
    #[error("service {service}: invalid request: {message}")]
    Invalid {
        /// The service.
        service: String,
        /// The rule broken.
        message: String,
    },
}

/// One request the service handled, as its log keeps it (the checkers' record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    /// The service.
    pub service: String,
    /// Simulated time since the world was built.
    pub at: Duration,
    /// The node that sent the request.
    pub caller: String,
    /// The request's subject.
    pub subject: String,
    /// The request's idempotency key.
    pub idempotency_key: Option<String>,
    /// Whether an effect was performed (false: a replayed idempotency key).
    pub applied: bool,
}

/// A service's state, shared by its node and the world: its idempotency keys and its log. It outlives the node's
/// tasks, as a real service's database would.
pub struct Service {
    name: Arc<str>,
    index: usize,
    options: ServiceOptions,
    seed: u64,
    trace: Trace,
    faults_on: Arc<AtomicBool>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Effect number by idempotency key.
    keys: BTreeMap<String, u64>,
    /// Effects performed so far (the last effect's number).
    performed: u64,
    log: Vec<Effect>,
}

/// A request datagram.
struct Request {
    reply_tag: u64,
    caller: Arc<str>,
    request: EffectRequest,
}

type Response = Result<EffectReceipt, String>;

impl Service {
    /// Service `name`, the `index`-th of the world (its address is 10.0.3.{index + 1}).
    pub fn new(
        name: &str,
        index: usize,
        options: ServiceOptions,
        seed: u64,
        trace: Trace,
        faults_on: Arc<AtomicBool>,
    ) -> Arc<Service> {
        assert!(index < SERVICES_MAX, "service addresses are 10.0.3.1 to 10.0.3.200");
        Arc::new(Service {
            name: Arc::from(name),
            index,
            options,
            seed,
            trace,
            faults_on,
            state: Mutex::new(State::default()),
        })
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's name: `svc-{name}`.
    pub fn node_name(&self) -> String {
        format!("svc-{}", self.name)
    }

    /// The node's address.
    pub fn ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 3, self.index as u8 + 1))
    }

    /// Where requests go.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip(), SERVICE_PORT)
    }

    /// Every request handled so far, in order.
    pub fn log(&self) -> Vec<Effect> {
        self.state().log.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Performs (or replays) one request at simulated time `at`; returns its receipt.
    fn perform(&self, caller: &str, request: &EffectRequest, at: Duration) -> EffectReceipt {
        let mut state = self.state();
        let replayed = request.idempotency_key.as_ref().and_then(|key| state.keys.get(key).copied());
        let effect = match replayed {
            Some(effect) => effect,
            None => {
                state.performed += 1;
                state.performed
            }
        };
        if let (None, Some(key)) = (replayed, &request.idempotency_key) {
            state.keys.insert(key.clone(), effect);
        }
        let applied = replayed.is_none();
        state.log.push(Effect {
            service: self.name.to_string(),
            at,
            caller: caller.to_string(),
            subject: request.subject.clone(),
            idempotency_key: request.idempotency_key.clone(),
            applied,
        });
        drop(state);
        let key = request.idempotency_key.as_deref().unwrap_or("none");
        self.trace.record(
            &Arc::from(self.node_name()),
            "effect",
            format!(
                "service={} subject={} key={} caller={caller} applied={applied} effect={effect}",
                self.name,
                super::gang::value(&request.subject),
                super::gang::value(key)
            ),
        );
        EffectReceipt { effect, replayed: !applied }
    }
}

#[cfg(madsim)]
/// The service node's life: bind, then handle requests until the world ends. Its init function.
pub async fn serve(service: Arc<Service>) {
    let endpoint = Endpoint::bind(service.addr()).await.expect("the service port is free");
    let rng = Arc::new(Mutex::new(rng::stream(service.seed, &format!("service-{}", service.name))));
    while let Ok((payload, from)) = endpoint.recv_from_raw(TAG_REQUEST).await {
        let request = *payload.downcast::<Request>().expect("a service datagram carries a Request");
        tokio::spawn(handle(service.clone(), endpoint.clone(), rng.clone(), request, from));
    }
}

#[cfg(madsim)]
async fn handle(
    service: Arc<Service>,
    endpoint: Endpoint,
    rng: Arc<Mutex<ChaCha8Rng>>,
    request: Request,
    from: SocketAddr,
) {
    let faults = service.faults_on.load(Ordering::SeqCst);
    let (latency, fails, loses) = {
        let mut rng = rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let latency = draw(&mut rng, &service.options.latency);
        let fails = faults && rng.random_bool(service.options.failure_chance);
        let loses = faults && rng.random_bool(service.options.lost_reply_chance);
        (latency, fails, loses)
    };
    tokio::time::sleep(latency).await;
    let response: Response = if fails {
        Err("503 service unavailable (planted)".into())
    } else {
        Ok(service.perform(&request.caller, &request.request, service.trace.elapsed()))
    };
    if loses && response.is_ok() {
        service.trace.record(&Arc::from(service.node_name()), "reply-dropped", format!("caller={}", request.caller));
        return;
    }
    // A send error means the network refused the datagram: the same as losing it.
    let _ = endpoint.send_to_raw(from, request.reply_tag, Box::new(response)).await;
}

fn draw(rng: &mut ChaCha8Rng, range: &Range<Duration>) -> Duration {
    if range.is_empty() {
        return range.start;
    }
    Duration::from_micros(rng.random_range(range.start.as_micros() as u64..range.end.as_micros() as u64))
}

#[cfg(any(madsim, doc))]
/// A handler's client of one service, on the replica node it was made on ([`ReplicaCx::service`]). Clones share its
/// endpoint. Simulator build only (`--cfg madsim`; the plain build's `cargo doc` shows it).
///
/// [`ReplicaCx::service`]: super::user::ReplicaCx::service
#[derive(Clone)]
pub struct ServiceClient {
    inner: Arc<ClientInner>,
}

#[cfg(any(madsim, doc))]
struct ClientInner {
    service: Arc<str>,
    addr: SocketAddr,
    node: Arc<str>,
    ip: IpAddr,
    timeout: Duration,
    next_tag: AtomicU64,
    /// Bound on the first call, on the node the call runs on.
    endpoint: tokio::sync::Mutex<Option<Endpoint>>,
}

#[cfg(any(madsim, doc))]
impl ServiceClient {
    /// A client of `service` for the node `node` at `ip`; `tag_base` is a reply-tag range unique in the run.
    pub(crate) fn new(service: &Service, node: Arc<str>, ip: IpAddr, tag_base: u64) -> ServiceClient {
        ServiceClient {
            inner: Arc::new(ClientInner {
                service: service.name.clone(),
                addr: service.addr(),
                node,
                ip,
                timeout: service.options.call_timeout,
                next_tag: AtomicU64::new(tag_base),
                endpoint: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The service's name.
    pub fn service(&self) -> &str {
        &self.inner.service
    }

    /// Sends `request` and waits for the receipt, at most the service's call time-out (simulated time).
    ///
    /// Errors: [`ServiceError::Timeout`] when no reply came (the request or its reply was lost, the service was
    /// slow, or the caller's node was cut off: the effect may have been performed); [`ServiceError::Failed`]
    /// when the service refused it (nothing performed); [`ServiceError::Invalid`] for a subject or key longer
    /// than [`REQUEST_TEXT_LEN_MAX`] (nothing sent).
    pub async fn call(&self, request: EffectRequest) -> Result<EffectReceipt, ServiceError> {
        let inner = &self.inner;
        let too_long = |text: &str| text.len() > REQUEST_TEXT_LEN_MAX;
        if too_long(&request.subject) || request.idempotency_key.as_deref().is_some_and(too_long) {
            let message = format!("subject and idempotency key are at most {REQUEST_TEXT_LEN_MAX} bytes");
            return Err(ServiceError::Invalid { service: inner.service.to_string(), message });
        }
        let endpoint = self.endpoint().await;
        let reply_tag = inner.next_tag.fetch_add(1, Ordering::Relaxed);
        let datagram = Request { reply_tag, caller: inner.node.clone(), request };
        let exchange = async {
            endpoint.send_to_raw(inner.addr, TAG_REQUEST, Box::new(datagram)).await?;
            endpoint.recv_from_raw(reply_tag).await
        };
        let timeout = || ServiceError::Timeout { service: inner.service.to_string(), timeout: inner.timeout };
        match tokio::time::timeout(inner.timeout, exchange).await {
            Ok(Ok((payload, _))) => match *payload.downcast::<Response>().expect("a reply carries a Response") {
                Ok(receipt) => Ok(receipt),
                Err(message) => Err(ServiceError::Failed { service: inner.service.to_string(), message }),
            },
            Ok(Err(_)) | Err(_) => Err(timeout()),
        }
    }

    async fn endpoint(&self) -> Endpoint {
        let mut slot = self.inner.endpoint.lock().await;
        if slot.is_none() {
            let bound = Endpoint::bind(SocketAddr::new(self.inner.ip, 0)).await.expect("an ephemeral port is free");
            *slot = Some(bound);
        }
        slot.as_ref().expect("bound above").clone()
    }
}
