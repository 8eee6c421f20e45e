//! Real faults for `lockstep chaos` (issue 15): the normal build's counterparts of the simulator's network faults.
//! Not in the simulator's graph (`#[cfg(not(madsim))]` in `lib.rs`).

pub mod proxy;
