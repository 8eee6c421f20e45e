//! A TCP proxy between one node (a replica or an agent) and PostgreSQL whose link faults are set at run time:
//! the real form of the simulator's network faults for `lockstep chaos`. One proxy per node: the node's
//! `DATABASE_URL` names the proxy's port instead of PostgreSQL's.
//!
//! What a link can do ([`LinkFault`]), and the scenario faults each serves:
//! - [`LinkFault::Pass`]: bytes flow (heal).
//! - [`LinkFault::Stall`]: bytes wait, in both directions, until the link passes again, and then flow in order: a
//!   partition that heals before TCP gives up (`partition`, `isolate`).
//! - [`LinkFault::BlackHole`]: bytes go nowhere and nothing closes: no FIN, no RST. A connection that carried
//!   traffic while black-holed stays dead when the link heals, as a half-open connection does after a NAT or
//!   firewall forgot it (pg-boss #850). TCP keepalive cannot notice it either: the proxy's sockets are alive and
//!   answer the probes, as a real middlebox does.
//! - [`LinkFault::Delay`]: every chunk waits a fixed time before it is forwarded (`degrade`, latency).
//! - [`LinkFault::Drop`]: every chunk is lost with a seeded probability (`degrade`, loss). PostgreSQL's protocol
//!   has no way to skip a gap in its byte stream, so the connection that lost a chunk is then cut with a reset:
//!   that is what a lost segment that is never retransmitted costs a session.
//! - [`LinkFault::LoseReplies`]: every chunk from the server is lost with a seeded probability, after the server
//!   sent it, and the connection is then cut (`lost-replies`): a statement or `COMMIT` whose reply is lost has
//!   run, and its client never hears.
//!
//! Besides the link's mode: [`ProxyHandle::cut`] resets every open connection (RST, as after a server crash or
//! `pg_terminate_backend`), [`ProxyHandle::black_hole_connections`] black-holes chosen open connections only
//! (found by their `application_name`, [`ProxyHandle::connections`]), and one-shot triggers aim at a
//! statement: [`ProxyHandle::cut_before`] (the session dies before the server sees the statement: a `COMMIT`
//! never arrives and the server rolls back), [`ProxyHandle::lose_reply_after`] (the statement runs, its reply
//! is lost, then the connection is cut), [`ProxyHandle::hold_before`] (the statement waits, so that a test can
//! end the server's session in between) and [`ProxyHandle::black_hole_from`] (the session that sends it goes
//! half-open).
//!
//! Randomness comes from one ChaCha stream seeded by [`ProxyOptions::seed`] (DESIGN §5: one stream per purpose).
//! The wall clock and real sockets make a run not reproducible: the proxy serves the normal build only.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Largest chunk a pump reads and forwards at once, in bytes. Triggers match within one chunk.
const CHUNK_BYTES_MAX: usize = 64 * 1024;
/// Bytes of a connection's first client messages kept to read its `application_name` from the startup message;
/// PostgreSQL itself refuses startup packets over 10 000 bytes.
const STARTUP_BYTES_MAX: usize = 10_000;
/// The protocol codes of the requests a client may send before its startup message (PostgreSQL protocol,
/// "Message Formats": SSLRequest, GSSENCRequest), each in a packet of 8 bytes.
const SSL_REQUEST_CODE: u32 = 80_877_103;
const GSSENC_REQUEST_CODE: u32 = 80_877_104;

/// What a proxy's link does to the bytes crossing it. See the module docs for the scenario faults each serves.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum LinkFault {
    /// Bytes flow.
    Pass,
    /// Bytes wait in both directions until the link's mode changes, then flow in order. New connections are
    /// accepted and wait too.
    Stall,
    /// Bytes are read and discarded, in both directions, with no FIN or RST. Every connection that carries a
    /// byte meanwhile is black-holed for good (half-open); connections opened after the link heals pass.
    BlackHole,
    /// Every chunk waits this long (wall clock) before it is forwarded.
    Delay(Duration),
    /// Every chunk, either direction, is lost with this probability in [0, 1]; its connection is then reset.
    Drop {
        /// Chance in [0, 1] that one chunk is lost.
        probability: f64,
    },
    /// Every chunk from the server is lost with this probability in [0, 1], after the server sent it; its
    /// connection is then reset.
    LoseReplies {
        /// Chance in [0, 1] that one chunk from the server is lost.
        probability: f64,
    },
}

/// How to start a [`Proxy`].
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    /// Where the proxy listens, e.g. `127.0.0.1:0` for a free port (see [`ProxyHandle::local_addr`]).
    pub listen: SocketAddr,
    /// PostgreSQL's address, e.g. `127.0.0.1:5432`.
    pub upstream: SocketAddr,
    /// Seed of the proxy's ChaCha stream, drawn from for [`LinkFault::Drop`] and [`LinkFault::LoseReplies`].
    pub seed: u64,
}

/// One connection through the proxy, as [`ProxyHandle::connections`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// The proxy's number for the connection, from 1 in order of acceptance.
    pub id: u64,
    /// The `application_name` of the client's startup message, once the proxy has seen it (absent if the client
    /// sent none).
    pub application_name: Option<String>,
    /// Whether the connection is black-holed (for good).
    pub black_holed: bool,
}

/// Counts of what a proxy did since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections reset by the proxy (cuts, triggers, lost chunks).
    pub resets: u64,
    /// Chunks discarded (black holes, lost chunks and replies, a cut statement).
    pub chunks_lost: u64,
    /// Times a pump held its chunk for a [`LinkFault::Stall`] (counted again after each control call while the
    /// link still stalls).
    pub chunks_held: u64,
    /// Bytes forwarded from clients to the server.
    pub bytes_up: u64,
    /// Bytes forwarded from the server to clients.
    pub bytes_down: u64,
}

/// A running proxy. Dropping it stops accepting and resets every open connection.
pub struct Proxy {
    handle: ProxyHandle,
    accept: JoinHandle<()>,
}

/// Controls a [`Proxy`] at run time; clones control the same proxy. Every call takes effect at once for the
/// chunks read afterwards (a chunk already waiting in a [`LinkFault::Delay`] is forwarded).
#[derive(Clone)]
pub struct ProxyHandle {
    inner: Arc<Inner>,
}

struct Inner {
    local_addr: SocketAddr,
    state: Mutex<State>,
    /// Bumped by every control call, so that pumps holding a chunk ([`LinkFault::Stall`]) look again.
    changed: watch::Sender<u64>,
    /// Bumped by control calls and by what the pumps do (a chunk held or lost, a connection opened or ended),
    /// for observers ([`ProxyHandle::watch`]). Apart from `changed`, so that a held chunk does not wake itself.
    observed: watch::Sender<u64>,
    next_id: AtomicU64,
    /// Chunks read from clients and not yet forwarded to the server nor dropped ([`ProxyHandle::requests_in_flight`]).
    up_in_flight: AtomicU64,
}

/// Counts one client chunk in [`Inner::up_in_flight`] while it lives (forwarded, dropped, or its pump ended).
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn new(count: &'a AtomicU64) -> InFlight<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct State {
    link: LinkFault,
    connections: BTreeMap<u64, Connection>,
    cut_before: Vec<Vec<u8>>,
    lose_reply_after: Vec<Vec<u8>>,
    black_hole_from: Vec<Vec<u8>>,
    hold_before: Vec<Vec<u8>>,
    rng: ChaCha8Rng,
    stats: ProxyStats,
}

struct Connection {
    application_name: Option<String>,
    /// The client's first bytes, until the startup message is read.
    startup: Option<Vec<u8>>,
    black_holed: bool,
    /// Set when a [`ProxyHandle::hold_before`] statement came up: it waits for [`ProxyHandle::release_held`].
    holding: bool,
    /// Set when a [`ProxyHandle::lose_reply_after`] statement went up: the server's next bytes are lost.
    lose_next_reply: bool,
    /// Both sockets, for a reset; `kill` stops the pumps.
    client: Arc<TcpStream>,
    server: Arc<TcpStream>,
    kill: watch::Sender<bool>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Direction {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// What a pump does with the chunk it read.
#[derive(Debug, PartialEq)]
enum Decision {
    Forward {
        delay: Duration,
    },
    /// Wait for the next control call, then decide again.
    Hold,
    Discard,
    /// Forward the first `keep` bytes, then reset the connection.
    Reset {
        keep: usize,
    },
}

impl Proxy {
    /// Binds `options.listen` and starts accepting; each accepted connection is joined to a new connection to
    /// `options.upstream`. The link starts in [`LinkFault::Pass`].
    ///
    /// Errors: the listen address cannot be bound.
    pub async fn start(options: ProxyOptions) -> io::Result<Proxy> {
        let listener = TcpListener::bind(options.listen).await?;
        let inner = Arc::new(Inner {
            local_addr: listener.local_addr()?,
            state: Mutex::new(State {
                link: LinkFault::Pass,
                connections: BTreeMap::new(),
                cut_before: Vec::new(),
                lose_reply_after: Vec::new(),
                black_hole_from: Vec::new(),
                hold_before: Vec::new(),
                rng: ChaCha8Rng::seed_from_u64(options.seed),
                stats: ProxyStats::default(),
            }),
            changed: watch::channel(0).0,
            observed: watch::channel(0).0,
            next_id: AtomicU64::new(1),
            up_in_flight: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, options.upstream, inner.clone()));
        Ok(Proxy { handle: ProxyHandle { inner }, accept })
    }

    /// A handle to control this proxy.
    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.handle.cut();
    }
}

impl ProxyHandle {
    /// The address the proxy listens on (the port to put in the node's database URL).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Sets the link's mode for every open and later connection. [`LinkFault::Pass`] heals: held chunks flow,
    /// but black-holed connections stay dead.
    ///
    /// Panics if a probability is outside [0, 1] (a caller's bug: scenario files are checked before).
    pub fn set(&self, fault: LinkFault) {
        if let LinkFault::Drop { probability } | LinkFault::LoseReplies { probability } = fault {
            assert!((0.0..=1.0).contains(&probability), "proxy fault {fault:?}: probability outside [0, 1]");
        }
        self.state().link = fault;
        self.bump();
    }

    /// The link's mode.
    pub fn link(&self) -> LinkFault {
        self.state().link
    }

    /// Resets every open connection now (RST to both ends); returns how many. The link's mode is unchanged.
    pub fn cut(&self) -> usize {
        let ids: Vec<u64> = self.state().connections.keys().copied().collect();
        ids.into_iter().filter(|&id| self.reset(id)).count()
    }

    /// The open connections, in order of acceptance.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        let state = self.state();
        state
            .connections
            .iter()
            .map(|(&id, c)| ConnectionInfo {
                id,
                application_name: c.application_name.clone(),
                black_holed: c.black_holed,
            })
            .collect()
    }

    /// Black-holes, for good, the open connections `choose` picks (say, a store's hint listener by its
    /// `application_name`); returns how many. Others and later ones are not affected.
    pub fn black_hole_connections(&self, choose: impl Fn(&ConnectionInfo) -> bool) -> usize {
        let chosen: Vec<u64> = self.connections().into_iter().filter(|c| choose(c)).map(|c| c.id).collect();
        let mut state = self.state();
        for id in &chosen {
            if let Some(connection) = state.connections.get_mut(id) {
                connection.black_holed = true;
            }
        }
        drop(state);
        self.bump();
        chosen.len()
    }

    /// Arms a one-shot trigger: the next chunk from a client that contains `pattern` (say, the simple query
    /// `COMMIT`) is not forwarded from the pattern on, and its connection is reset, so the server never sees the
    /// statement and rolls back. Matched within one chunk of at most 64 KiB.
    pub fn cut_before(&self, pattern: &[u8]) {
        assert!(!pattern.is_empty(), "cut_before: empty pattern");
        self.state().cut_before.push(pattern.to_vec());
    }

    /// Arms a one-shot trigger: after the next chunk from a client that contains `pattern` is forwarded, the
    /// server's next chunk on that connection (the statement's reply) is lost and the connection reset. The
    /// statement ran; its client never hears. Matched within one chunk of at most 64 KiB.
    pub fn lose_reply_after(&self, pattern: &[u8]) {
        assert!(!pattern.is_empty(), "lose_reply_after: empty pattern");
        self.state().lose_reply_after.push(pattern.to_vec());
    }

    /// Arms a one-shot trigger: the connection whose client next sends a chunk containing `pattern` is
    /// black-holed for good from that chunk on (the chunk goes nowhere). Aims a half-open connection at one
    /// session, e.g. a store's hint listener by its `LISTEN`. Matched within one chunk of at most 64 KiB.
    pub fn black_hole_from(&self, pattern: &[u8]) {
        assert!(!pattern.is_empty(), "black_hole_from: empty pattern");
        self.state().black_hole_from.push(pattern.to_vec());
    }

    /// Arms a one-shot trigger: the next chunk from a client that contains `pattern` waits, and so does its
    /// connection's client side, until [`ProxyHandle::release_held`]; the server's side still flows. Aims a fault
    /// between two statements, e.g. `pg_terminate_backend` of a session whose `COMMIT` is on its way (see
    /// [`ProxyHandle::holding`]). Matched within one chunk of at most 64 KiB.
    pub fn hold_before(&self, pattern: &[u8]) {
        assert!(!pattern.is_empty(), "hold_before: empty pattern");
        self.state().hold_before.push(pattern.to_vec());
    }

    /// The connections whose client side a [`ProxyHandle::hold_before`] trigger holds.
    pub fn holding(&self) -> Vec<ConnectionInfo> {
        let held: Vec<u64> = self.state().connections.iter().filter(|(_, c)| c.holding).map(|(&id, _)| id).collect();
        self.connections().into_iter().filter(|c| held.contains(&c.id)).collect()
    }

    /// Lets every chunk a [`ProxyHandle::hold_before`] trigger holds go on (through the link's mode and the
    /// other triggers); returns how many connections were held.
    pub fn release_held(&self) -> usize {
        let mut state = self.state();
        let mut released = 0;
        for connection in state.connections.values_mut().filter(|c| c.holding) {
            connection.holding = false;
            released += 1;
        }
        drop(state);
        self.bump();
        released
    }

    /// How many one-shot triggers are armed and not yet fired.
    pub fn triggers_armed(&self) -> usize {
        let state = self.state();
        state.cut_before.len() + state.lose_reply_after.len() + state.black_hole_from.len() + state.hold_before.len()
    }

    /// Chunks the proxy read from its clients and has not yet forwarded to the server nor dropped: messages on
    /// their way up (delayed or held). `lockstep chaos run` SIGSTOPs a replica only when none of its messages is
    /// (`[faults] pause_inside_pass`): one arriving at the server afterwards would open a transaction that the
    /// server ends while the replica sleeps.
    pub fn requests_in_flight(&self) -> u64 {
        self.inner.up_in_flight.load(Ordering::SeqCst)
    }

    /// What the proxy did since it started.
    pub fn stats(&self) -> ProxyStats {
        self.state().stats
    }

    /// A receiver that changes with every control call, every chunk held or lost, and every connection opened
    /// or ended (tests wait on it rather than sleep).
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.inner.observed.subscribe()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state()
    }

    fn bump(&self) {
        self.inner.bump();
    }

    /// Resets connection `id` if it is open; returns whether it was.
    fn reset(&self, id: u64) -> bool {
        self.inner.reset(id)
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // A pump that panicked holding the lock leaves counts behind, nothing unsafe to read.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes held pumps and observers after a control call.
    fn bump(&self) {
        self.changed.send_modify(|generation| *generation += 1);
        self.observe();
    }

    /// Wakes observers only.
    fn observe(&self) {
        self.observed.send_modify(|generation| *generation += 1);
    }

    fn reset(&self, id: u64) -> bool {
        let Some(connection) = self.state().connections.remove(&id) else {
            return false;
        };
        // Zero linger: closing sends RST rather than FIN. The sockets close when the pumps drop their clones.
        for socket in [&connection.client, &connection.server] {
            if let Err(err) = socket.set_zero_linger() {
                tracing::debug!(connection = id, error = %err, "proxy: cannot set zero linger");
            }
        }
        connection.kill.send_replace(true);
        self.state().stats.resets += 1;
        self.bump();
        true
    }

    /// Decides the fate of `chunk`, read from `direction` of connection `id`, under the state's lock.
    fn decide(&self, id: u64, direction: Direction, chunk: &[u8]) -> Decision {
        let mut state = self.state();
        let State { link, connections, cut_before, lose_reply_after, black_hole_from, hold_before, rng, stats } =
            &mut *state;
        let Some(connection) = connections.get_mut(&id) else {
            return Decision::Discard;
        };
        if direction == Direction::Up
            && let Some(startup) = connection.startup.as_mut()
        {
            startup.extend_from_slice(chunk);
            match application_name(startup) {
                Startup::Incomplete if startup.len() < STARTUP_BYTES_MAX => {}
                Startup::Incomplete | Startup::Unreadable => connection.startup = None,
                Startup::Read(name) => {
                    connection.application_name = name;
                    connection.startup = None;
                }
            }
        }
        if direction == Direction::Up
            && let Some((i, _)) = first_match(black_hole_from, chunk)
        {
            black_hole_from.remove(i);
            connection.black_holed = true;
        }
        if direction == Direction::Up
            && !connection.black_holed
            && let Some((i, _)) = first_match(hold_before, chunk)
        {
            hold_before.remove(i);
            connection.holding = true;
        }
        let triggers = Triggers { cut_before, lose_reply_after };
        let decision = if direction == Direction::Up && connection.holding && !connection.black_holed {
            Decision::Hold
        } else {
            decide_chunk(link, connection, direction, chunk, triggers, rng)
        };
        match decision {
            Decision::Forward { .. } => match direction {
                Direction::Up => stats.bytes_up += chunk.len() as u64,
                Direction::Down => stats.bytes_down += chunk.len() as u64,
            },
            Decision::Discard | Decision::Reset { .. } => stats.chunks_lost += 1,
            Decision::Hold => stats.chunks_held += 1,
        }
        drop(state);
        if !matches!(decision, Decision::Forward { .. }) {
            self.observe();
        }
        decision
    }
}

/// The rule of [`Inner::decide`], apart from the bookkeeping. Black-holed connections swallow everything; then
/// the link's mode; then the triggers.
fn decide_chunk(
    link: &LinkFault,
    connection: &mut Connection,
    direction: Direction,
    chunk: &[u8],
    triggers: Triggers<'_>,
    rng: &mut ChaCha8Rng,
) -> Decision {
    let Triggers { cut_before, lose_reply_after } = triggers;
    if connection.black_holed {
        return Decision::Discard;
    }
    let delay = match *link {
        LinkFault::Stall => return Decision::Hold,
        LinkFault::BlackHole => {
            connection.black_holed = true;
            return Decision::Discard;
        }
        LinkFault::Drop { probability } if rng.random_bool(probability) => return Decision::Reset { keep: 0 },
        LinkFault::LoseReplies { probability } if direction == Direction::Down && rng.random_bool(probability) => {
            return Decision::Reset { keep: 0 };
        }
        LinkFault::Delay(delay) => delay,
        LinkFault::Pass | LinkFault::Drop { .. } | LinkFault::LoseReplies { .. } => Duration::ZERO,
    };
    match direction {
        Direction::Down if connection.lose_next_reply => Decision::Reset { keep: 0 },
        Direction::Down => Decision::Forward { delay },
        Direction::Up => {
            if let Some((i, at)) = first_match(cut_before, chunk) {
                cut_before.remove(i);
                return Decision::Reset { keep: at };
            }
            if let Some((i, _)) = first_match(lose_reply_after, chunk) {
                lose_reply_after.remove(i);
                connection.lose_next_reply = true;
            }
            Decision::Forward { delay }
        }
    }
}

/// The one-shot triggers [`decide_chunk`] may fire (and disarm).
struct Triggers<'a> {
    cut_before: &'a mut Vec<Vec<u8>>,
    lose_reply_after: &'a mut Vec<Vec<u8>>,
}

/// The first pattern of `patterns` found in `chunk`: its index and where in `chunk` it starts.
fn first_match(patterns: &[Vec<u8>], chunk: &[u8]) -> Option<(usize, usize)> {
    patterns.iter().enumerate().find_map(|(i, pattern)| {
        chunk.windows(pattern.len()).position(|window| window == pattern.as_slice()).map(|at| (i, at))
    })
}

enum Startup {
    Incomplete,
    Unreadable,
    Read(Option<String>),
}

/// The `application_name` of the startup message at the start of `bytes` (after any SSLRequest or
/// GSSENCRequest packets): PostgreSQL protocol, "StartupMessage": Int32 length (itself included), Int32 protocol
/// version, then NUL-terminated name and value strings, ended by an empty name.
fn application_name(bytes: &[u8]) -> Startup {
    let mut rest = bytes;
    loop {
        let Some((len, code)) = rest.get(..8).map(|head| (be_u32(&head[..4]) as usize, be_u32(&head[4..8]))) else {
            return Startup::Incomplete;
        };
        if len == 8 && (code == SSL_REQUEST_CODE || code == GSSENC_REQUEST_CODE) {
            rest = &rest[8..];
            continue;
        }
        if !(8..=STARTUP_BYTES_MAX).contains(&len) {
            return Startup::Unreadable;
        }
        let Some(message) = rest.get(8..len) else {
            return Startup::Incomplete;
        };
        let mut fields = message.split(|&b| b == 0);
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            if name.is_empty() {
                break;
            }
            if name == b"application_name" {
                return Startup::Read(Some(String::from_utf8_lossy(value).into_owned()));
            }
        }
        return Startup::Read(None);
    }
}

fn be_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes.try_into().expect("four bytes"))
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, inner: Arc<Inner>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(err) => {
                // Out of file descriptors and the like: the client's connect fails; keep serving the others.
                tracing::warn!(error = %err, "proxy: accept failed");
                continue;
            }
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            match TcpStream::connect(upstream).await {
                Ok(server) => serve(client, server, inner).await,
                Err(err) => {
                    // The client sees its connection closed, as if the server refused it.
                    tracing::warn!(error = %err, %upstream, "proxy: cannot reach the server");
                }
            }
        });
    }
}

/// Registers the connection, runs its two pumps until both end, and forgets it.
async fn serve(client: TcpStream, server: TcpStream, inner: Arc<Inner>) {
    for socket in [&client, &server] {
        // Small protocol messages go out at once, as PostgreSQL and its clients set it themselves.
        if let Err(err) = socket.set_nodelay(true) {
            tracing::debug!(error = %err, "proxy: cannot set TCP_NODELAY");
        }
    }
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    let (client, server) = (Arc::new(client), Arc::new(server));
    let (kill, killed) = watch::channel(false);
    {
        let mut state = inner.state();
        state.stats.accepted += 1;
        state.connections.insert(
            id,
            Connection {
                application_name: None,
                startup: Some(Vec::new()),
                black_holed: false,
                holding: false,
                lose_next_reply: false,
                client: client.clone(),
                server: server.clone(),
                kill,
            },
        );
    }
    inner.bump();
    let up = pump(id, Direction::Up, client.clone(), server.clone(), inner.clone(), killed.clone());
    let down = pump(id, Direction::Down, server, client, inner.clone(), killed);
    tokio::join!(up, down);
    if inner.state().connections.remove(&id).is_some() {
        inner.bump();
    }
}

/// Moves chunks from `from` to `to` as the link decides, until `from` ends, a write fails, or the connection is
/// reset. Forwards the end of `from` as a FIN on `to` unless the connection is black-holed.
async fn pump(
    id: u64,
    direction: Direction,
    from: Arc<TcpStream>,
    to: Arc<TcpStream>,
    inner: Arc<Inner>,
    mut killed: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; CHUNK_BYTES_MAX];
    let mut changed = inner.changed.subscribe();
    loop {
        let read = tokio::select! {
            read = read_some(&from, &mut buf) => read,
            _ = killed.wait_for(|&k| k) => return,
        };
        let n = match read {
            Ok(0) => {
                let black_holed = inner.state().connections.get(&id).is_none_or(|c| c.black_holed);
                if !black_holed {
                    shutdown_write(&to);
                }
                return;
            }
            Ok(n) => n,
            Err(_) => {
                inner.reset(id);
                return;
            }
        };
        let chunk = &buf[..n];
        let _in_flight = (direction == Direction::Up).then(|| InFlight::new(&inner.up_in_flight));
        loop {
            // Mark the generation seen before deciding, so a control call during the decision wakes a hold.
            changed.borrow_and_update();
            match inner.decide(id, direction, chunk) {
                Decision::Forward { delay } => {
                    if !delay.is_zero() {
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = killed.wait_for(|&k| k) => return,
                        }
                    }
                    if write_all(&to, chunk).await.is_err() {
                        inner.reset(id);
                        return;
                    }
                    break;
                }
                Decision::Hold => tokio::select! {
                    _ = changed.changed() => {}
                    _ = killed.wait_for(|&k| k) => return,
                },
                Decision::Discard => break,
                Decision::Reset { keep } => {
                    if keep > 0 {
                        let _ = write_all(&to, &chunk[..keep]).await;
                    }
                    inner.reset(id);
                    return;
                }
            }
        }
    }
}

async fn read_some(socket: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        socket.readable().await?;
        match socket.try_read(buf) {
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

async fn write_all(socket: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        socket.writable().await?;
        match socket.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Half-closes `socket`'s sending side (FIN), passing on the other end's close.
fn shutdown_write(socket: &TcpStream) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(socket);
    // SAFETY: `fd` is the open socket `socket` owns for the duration of this call; shutdown does not close it.
    let done = unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    if done != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "proxy: shutdown failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup(params: &[(&str, &str)]) -> Vec<u8> {
        let mut body = 196_608u32.to_be_bytes().to_vec();
        for (name, value) in params {
            body.extend_from_slice(name.as_bytes());
            body.push(0);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut message = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        message.extend_from_slice(&body);
        message
    }

    #[test]
    fn the_startup_message_names_its_application_after_an_ssl_request() {
        let mut bytes = 8u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&SSL_REQUEST_CODE.to_be_bytes());
        bytes.extend_from_slice(&startup(&[("user", "postgres"), ("application_name", "r0 hints")]));
        assert!(matches!(application_name(&bytes), Startup::Read(Some(name)) if name == "r0 hints"));
        assert!(matches!(application_name(&bytes[..bytes.len() - 3]), Startup::Incomplete));
        assert!(matches!(application_name(&startup(&[("user", "x")])), Startup::Read(None)));
        assert!(matches!(application_name(&[0, 0, 0, 1, 0, 0, 0, 0]), Startup::Unreadable));
    }

    #[test]
    fn patterns_match_inside_a_chunk() {
        let patterns = vec![b"COMMIT".to_vec(), b"xyz".to_vec()];
        assert_eq!(first_match(&patterns, b"Q\0\0\0\x0bCOMMIT\0"), Some((0, 5)));
        assert_eq!(first_match(&patterns, b"..xyz"), Some((1, 2)));
        assert_eq!(first_match(&patterns, b"COMMI"), None);
    }
}
