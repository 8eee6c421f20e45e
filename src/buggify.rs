//! `buggify` points in the engine's hot paths (DESIGN §5; FoundationDB's BUGGIFY, madsim's `buggify`).
//!
//! Each point is a rare, legal misbehaviour that real deployments produce now and then: a fetcher stalled
//! between its fetch and queuing the rows, a heartbeat pass that never ran, a worker stalled before its apply, an
//! apply sent twice. A point fires only in a simulator run that enabled buggify (`madsim::buggify::enable`), with
//! the point's chance, drawn from the simulator's seeded RNG, so a run stays a function of its seed. In a normal
//! build madsim's `buggify` is a constant `false` (checked in madsim 0.2.34's `std/buggify.rs`), so this module
//! needs no `cfg`, and this is the one file of the engine that names madsim.

/// A place in the engine where buggify may inject a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    /// The fetcher stalls for a lease ttl between the fetch's reply and queuing its rows, so the rows may arrive
    /// with their local deadlines passed and their leases taken by another replica.
    FetchStall,
    /// The heartbeater skips a pass, as a heartbeater starved of CPU would; a run of skips loses leases.
    HeartbeatSkip,
    /// A worker stalls for a lease ttl between processing and its apply.
    ApplyStall,
    /// A worker sends its apply a second time after it applied, as a client retrying a call would; the second
    /// one must find the token gone and write nothing.
    ApplyRepeat,
}

impl Point {
    /// Chance the point fires each time it is reached, while buggify is enabled. The stalls cost a lease ttl
    /// each, so they are rare; a repeated apply costs one call, so it takes madsim's default chance. (While
    /// buggify is on, madsim also delays one packet in ten by seconds, so few items reach their apply.)
    fn chance(self) -> f64 {
        match self {
            Point::FetchStall => 0.02,
            Point::HeartbeatSkip => 0.1,
            Point::ApplyStall => 0.02,
            Point::ApplyRepeat => 0.25,
        }
    }
}

/// Whether `point` fires now (never outside a simulator run with buggify enabled).
pub(crate) fn fires(point: Point) -> bool {
    madsim::buggify::buggify_with_prob(point.chance())
}
