//! The store conformance suite (`lockstep::store::conformance`) against MemStore on a manual clock.

use lockstep::store::conformance::Harness;
use lockstep::store::{ManualClock, MemStore, Timestamp};
use std::time::Duration;

/// A fresh MemStore and the manual clock it reads.
struct MemHarness {
    store: MemStore,
    clock: ManualClock,
}

impl Harness for MemHarness {
    type S = MemStore;

    fn store(&self) -> &MemStore {
        &self.store
    }

    fn advance(&self, span: Duration) {
        self.clock.advance(span);
    }
}

async fn mem_harness() -> MemHarness {
    let clock = ManualClock::new(Timestamp(1_700_000_000_000_000));
    MemHarness { store: MemStore::new(clock.clone()), clock }
}

lockstep::conformance_tests!(mem_harness());
