//! The hinter: turns fetch hints from the store's hint channel into wake-ups of the fetchers of the hinted kind,
//! in every state of the fetcher (DESIGN §3). Hints cross replicas through the store (PostgreSQL `NOTIFY`), where
//! dstack's stay inside one process.

use super::queue::Shared;
use crate::store::{HINT_EVERY_KIND, Hint, parse_wake_hint};
use std::sync::Arc;
use tokio::sync::broadcast::{self, error::RecvError};

/// Routes hints to fetchers.
pub struct Hinter {
    receiver: broadcast::Receiver<Hint>,
    routes: Vec<(String, Arc<Shared>)>,
}

impl Hinter {
    /// A hinter reading `receiver` that wakes each `(kind, pipeline)` route whose kind is hinted.
    pub fn new(receiver: broadcast::Receiver<Hint>, routes: Vec<(String, Arc<Shared>)>) -> Hinter {
        Hinter { receiver, routes }
    }

    /// Waits for one hint and wakes the fetchers of its kind; returns how many were woken, or `None` when the
    /// hint channel closed. After a lag (hints were dropped) and for the catch-up hint [`HINT_EVERY_KIND`] (the
    /// store's listener missed hints), every fetcher is woken.
    pub async fn run_once(&mut self) -> Option<usize> {
        let kind = match self.receiver.recv().await {
            Ok(kind) if kind == HINT_EVERY_KIND => None,
            Ok(hint) => match parse_wake_hint(&hint) {
                // A wake: rows some parked waiter waits on were freed (DESIGN §3, "Parked waiters").
                Some(rows) => return Some(self.routes.iter().map(|(_, shared)| shared.wake_rows(&rows)).sum()),
                None => Some(hint),
            },
            Err(RecvError::Lagged(_)) => None,
            Err(RecvError::Closed) => return None,
        };
        if kind.is_none() {
            // Hints were lost, wakes among them: every parked waiter tries again.
            for (_, shared) in &self.routes {
                shared.wake_all();
            }
        }
        let mut woken = 0;
        for (route_kind, shared) in &self.routes {
            if kind.as_deref().is_none_or(|kind| kind == route_kind) {
                shared.hint.notify_one();
                woken += 1;
            }
        }
        Some(woken)
    }

    /// The hinter's loop, until the hint channel closes.
    pub async fn run(mut self) {
        while self.run_once().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::PipelineConfig;

    fn route(kind: &str) -> (String, Arc<Shared>) {
        (kind.to_string(), Arc::new(Shared::new(&PipelineConfig::new(kind, kind, &["ready"]))))
    }

    #[tokio::test]
    async fn a_hint_wakes_its_kind_and_the_catch_up_hint_wakes_every_kind() {
        let (hints, receiver) = broadcast::channel(8);
        let mut hinter = Hinter::new(receiver, vec![route("job"), route("node")]);
        hints.send("job".to_string()).unwrap();
        assert_eq!(hinter.run_once().await, Some(1));
        hints.send(HINT_EVERY_KIND.to_string()).unwrap();
        assert_eq!(hinter.run_once().await, Some(2), "the catch-up hint wakes every fetcher");
    }
}
