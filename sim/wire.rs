//! The simulated links that store calls and fetch hints cross between the nodes and the database node (DESIGN §5).
//!
//! A datagram sent from one node's address to another's is lost, or it arrives after a latency: lost when the
//! link between the two is cut (a partition, either end isolated) at the time it is sent, or by the link's loss
//! rate; delayed by a latency drawn uniformly from the links' latency range, plus, while madsim's `buggify` is
//! on, a delay of 1–4 s for one datagram in ten (as madsim delays its own packets). The faults of the world set
//! the range, the loss rate and the cuts (the `World`'s network handle), as they set madsim's
//! network for the services' datagrams.
//!
//! Why not madsim's `Endpoint`: a measurement found a store call through two `Endpoint` datagrams to cost about as
//! much as the rest of the simulator (a tenth of a 10 000-row run formats socket addresses, in madsim's
//! `ServiceAddr::from_addr_proto`, two per datagram; each datagram takes three timers, one of them a receive delay
//! of at least 1 ms that no scenario asked for). Here a datagram is one draw and, at its receiver, one timer.
//!
//! Every draw comes from the wire's own ChaCha stream ([`rng::stream`] `"wire"`), in the order the nodes send, so
//! a run stays a function of its seed.

use super::rng;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Chance that a datagram is delayed by seconds while `buggify` is on (madsim's own chance for its packets).
pub const BUGGIFY_DELAY_CHANCE: f64 = 0.1;
/// The delays of a datagram that `buggify` delays: whole seconds in this range (madsim's own for its packets).
pub const BUGGIFY_DELAY_SECS: Range<u64> = 1..5;

/// The links between the world's nodes, named by their addresses. Shared by the world (which changes them), the
/// database node and every store client.
pub struct Wire {
    state: Mutex<State>,
}

struct State {
    rng: ChaCha8Rng,
    latency: Range<Duration>,
    loss: f64,
    /// Directed links cut, and how many faults cut each.
    cut: BTreeMap<(IpAddr, IpAddr), u32>,
    /// Addresses cut off from every other.
    isolated: BTreeSet<IpAddr>,
}

impl Wire {
    /// Links with latencies in `latency` (simulated time), no loss and no cut, drawing from the run's stream of
    /// `seed`.
    pub fn new(seed: u64, latency: Range<Duration>) -> Wire {
        let state = State {
            rng: rng::stream(seed, "wire"),
            latency,
            loss: 0.0,
            cut: BTreeMap::new(),
            isolated: BTreeSet::new(),
        };
        Wire { state: Mutex::new(state) }
    }

    /// Every link from now on: latencies in `latency`, and a loss of `loss` (a chance in [0, 1]) of its datagrams.
    pub fn set_conditions(&self, latency: Range<Duration>, loss: f64) {
        assert!((0.0..=1.0).contains(&loss), "loss {loss} is not a chance in 0..=1");
        let mut state = self.state();
        state.latency = latency;
        state.loss = loss;
    }

    /// Cuts the link from `src` to `dst` (one way), until as many [`Wire::join`]s.
    pub fn cut(&self, src: IpAddr, dst: IpAddr) {
        *self.state().cut.entry((src, dst)).or_default() += 1;
    }

    /// Undoes one [`Wire::cut`] of the link from `src` to `dst`.
    pub fn join(&self, src: IpAddr, dst: IpAddr) {
        let mut state = self.state();
        if let Some(count) = state.cut.get_mut(&(src, dst)) {
            *count -= 1;
            if *count == 0 {
                state.cut.remove(&(src, dst));
            }
        }
    }

    /// Cuts every link of `ip` (either way) until [`Wire::rejoin`].
    pub fn isolate(&self, ip: IpAddr) {
        self.state().isolated.insert(ip);
    }

    /// Undoes [`Wire::isolate`] of `ip`.
    pub fn rejoin(&self, ip: IpAddr) {
        self.state().isolated.remove(&ip);
    }

    /// Every link whole again, with latencies in `latency` and no loss (the world's heal).
    pub fn heal(&self, latency: Range<Duration>) {
        let mut state = self.state();
        state.cut.clear();
        state.isolated.clear();
        state.latency = latency;
        state.loss = 0.0;
    }

    /// A datagram sent now from `src` to `dst`: `None` if it is lost, else how long it takes to arrive
    /// (simulated time).
    pub fn send(&self, src: IpAddr, dst: IpAddr) -> Option<Duration> {
        let mut state = self.state();
        let cut = state.isolated.contains(&src) || state.isolated.contains(&dst) || state.cut.contains_key(&(src, dst));
        if cut {
            return None;
        }
        let loss = state.loss;
        if loss > 0.0 && state.rng.random_bool(loss) {
            return None;
        }
        let latency = state.latency.clone();
        let mut delay = if latency.is_empty() {
            latency.start
        } else {
            let micros = latency.start.as_micros() as u64..latency.end.as_micros() as u64;
            Duration::from_micros(state.rng.random_range(micros))
        };
        if madsim::buggify::is_enabled() && state.rng.random_bool(BUGGIFY_DELAY_CHANCE) {
            delay += Duration::from_secs(state.rng.random_range(BUGGIFY_DELAY_SECS));
        }
        Some(delay)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// In the normal build: madsim's `buggify` there needs no runtime (under the simulator it reads the runtime's RNG).
#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn a_datagram_takes_a_latency_of_the_range() {
        let wire = Wire::new(7, ms(2)..ms(5));
        for _ in 0..1_000 {
            let delay = wire.send(ip(1), ip(2)).expect("no loss, no cut");
            assert!((ms(2)..ms(5)).contains(&delay), "{delay:?}");
        }
    }

    #[test]
    fn a_cut_link_loses_datagrams_one_way_until_every_cut_is_joined() {
        let wire = Wire::new(7, ms(1)..ms(2));
        wire.cut(ip(1), ip(2));
        wire.cut(ip(1), ip(2));
        assert_eq!(wire.send(ip(1), ip(2)), None);
        assert!(wire.send(ip(2), ip(1)).is_some(), "the other way is whole");
        wire.join(ip(1), ip(2));
        assert_eq!(wire.send(ip(1), ip(2)), None, "one cut still holds it");
        wire.join(ip(1), ip(2));
        assert!(wire.send(ip(1), ip(2)).is_some());
    }

    #[test]
    fn an_isolated_address_loses_every_datagram_both_ways_until_the_heal() {
        let wire = Wire::new(7, ms(1)..ms(2));
        wire.isolate(ip(3));
        assert_eq!(wire.send(ip(3), ip(1)), None);
        assert_eq!(wire.send(ip(1), ip(3)), None);
        assert!(wire.send(ip(1), ip(2)).is_some());
        wire.heal(ms(1)..ms(2));
        assert!(wire.send(ip(3), ip(1)).is_some());
    }

    #[test]
    fn a_loss_rate_loses_about_that_share() {
        let wire = Wire::new(11, ms(1)..ms(2));
        wire.set_conditions(ms(1)..ms(2), 0.25);
        let lost = (0..10_000).filter(|_| wire.send(ip(1), ip(2)).is_none()).count();
        assert!((2_200..2_800).contains(&lost), "{lost} of 10 000 lost");
    }
}
