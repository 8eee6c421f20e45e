//! A controller replica: a [`PipelineManager`] running the operation pipeline over a store (DESIGN §3, §4). Every
//! replica runs the same pipelines; they share the work through leases, so any number of them may run against one
//! store and any of them may die (`lockstep serve` is one replica on PostgreSQL).

use super::node_watch::NodeWatch;
use super::pipeline::{OperationHandler, operation_pipeline_config};
use super::placement::{GangPlacement, NODE_RETURN_GRACE_DEFAULT, PlacementSettings, UNFIT_TIMEOUT_DEFAULT};
use crate::pipeline::{ConfigError, ManagerOptions, PipelineConfig, PipelineManager, Retention, RetentionRule};
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;

/// What a replica may tune: the operation pipeline's workers and lease timing, and the placement of gang
/// operations. Every pipeline default is the engine's (`crate::pipeline` config defaults: 20 workers, 30 s lease,
/// 2 s margin, 1 s heartbeat, 5 s between passes over a running operation).
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaConfig {
    /// Workers of the operation pipeline: passes over different operations run at once. Default 20.
    pub workers: usize,
    /// Lease length of an operation pass, store clock: how long a dead replica's operation waits before another
    /// replica takes it over. Default 30 s.
    pub lease_ttl: Duration,
    /// Local margin before the store-side expiry. Default 2 s.
    pub lease_margin: Duration,
    /// Heartbeat period of the pipeline's leases, local clock. Default 1 s.
    pub heartbeat_interval: Duration,
    /// Least time between two passes over one running operation without a fetch hint, store clock: how soon a
    /// lost node is noticed when no report wakes the operation. Default 5 s.
    pub min_processing_interval: Duration,
    /// Seed of the engine's fetch jitter. Default 0 (any value will do in production).
    pub seed: u64,
    /// Placement of gang operations whose spec leaves `gang_placement` out, fixed at each one's first pass.
    /// Default [`GangPlacement::Incremental`] (YTsaurus's behaviour).
    pub gang_placement: GangPlacement,
    /// An all-or-nothing incarnation needing more allocations than the live nodes offer fails after this long
    /// (store clock). Default [`UNFIT_TIMEOUT_DEFAULT`] (60 s).
    pub gang_unfit_timeout: Duration,
    /// A node lost less than this long ago (store clock) is expected back: its slots count toward what a gang could
    /// ever get ([`PlacementSettings::node_return_grace`]). Default [`NODE_RETURN_GRACE_DEFAULT`] (5 min).
    pub node_return_grace: Duration,
    /// Mutation testing only (`lockstep chaos run`'s `[mutation] gang_gate_disabled`): all-or-nothing gangs are
    /// placed incrementally ([`PlacementSettings::gate_disabled_for_mutation_test`]). Default false.
    pub gang_gate_disabled_for_mutation_test: bool,
    /// Retention rules of the controller's rows (`lockstep serve --retain`), checked and completed by
    /// [`super::retention::rules`]: finished operations, and their jobs and inbox messages once the operation is
    /// final, go after an age. A pass runs every [`Retention::every`] (60 s). Default none: every row stays.
    pub retention: Vec<RetentionRule>,
}

impl Default for ReplicaConfig {
    fn default() -> ReplicaConfig {
        let defaults = operation_pipeline_config();
        ReplicaConfig {
            workers: defaults.workers,
            lease_ttl: defaults.lease_ttl,
            lease_margin: defaults.lease_margin,
            heartbeat_interval: defaults.heartbeat_interval,
            min_processing_interval: defaults.min_processing_interval,
            seed: 0,
            gang_placement: GangPlacement::Incremental,
            gang_unfit_timeout: UNFIT_TIMEOUT_DEFAULT,
            node_return_grace: NODE_RETURN_GRACE_DEFAULT,
            gang_gate_disabled_for_mutation_test: false,
            retention: Vec::new(),
        }
    }
}

impl ReplicaConfig {
    /// The operation pipeline's config with this replica's settings (heartbeat trigger `lease_ttl / 2`).
    pub fn pipeline_config(&self) -> PipelineConfig {
        PipelineConfig {
            workers: self.workers,
            lease_margin: self.lease_margin,
            heartbeat_interval: self.heartbeat_interval,
            min_processing_interval: self.min_processing_interval,
            ..operation_pipeline_config().with_lease_ttl(self.lease_ttl)
        }
    }

    /// The placement settings of the replica's controller passes.
    pub fn placement_settings(&self) -> PlacementSettings {
        PlacementSettings {
            default: self.gang_placement,
            unfit_timeout: self.gang_unfit_timeout,
            node_return_grace: self.node_return_grace,
            gate_disabled_for_mutation_test: self.gang_gate_disabled_for_mutation_test,
            lingering_gate_disabled_for_mutation_test: false,
        }
    }

    /// Store connections the replica uses at most: the pipeline's workers, fetch loops, heartbeater and apply batches
    /// in flight ([`PipelineConfig::connections_needed`]).
    pub fn connections_needed(&self) -> usize {
        self.pipeline_config().connections_needed()
    }

    /// Registers the operation pipeline on a new manager over `store`, with the retention of `retention` if any,
    /// and starts it. Errors: a config rule the settings break (named by field), a store pool too small for the
    /// workers, or a retention rule [`super::retention::rules`] refuses.
    pub fn start<S: Store>(&self, store: Arc<S>) -> Result<PipelineManager<S>, ConfigError> {
        let mut manager = PipelineManager::new(store, ManagerOptions { seed: self.seed });
        let handler = OperationHandler::default().with_settings(self.placement_settings());
        register_controller(&mut manager, self.pipeline_config(), handler)?;
        if !self.retention.is_empty() {
            let rules = super::retention::rules(self.retention.clone()).map_err(ConfigError::Retention)?;
            manager.retain(Retention::new(rules))?;
        }
        manager.start();
        Ok(manager)
    }
}

/// Registers the operation pipeline `config` with `handler` on `manager`, and the default [`NodeWatch`] beside it:
/// what every controller replica runs, `lockstep serve` and the simulator's replicas alike. Errors: those of
/// [`PipelineManager::register`].
pub fn register_controller<S: Store>(
    manager: &mut PipelineManager<S>,
    config: PipelineConfig,
    handler: OperationHandler,
) -> Result<(), ConfigError> {
    manager.register(config, handler)?;
    manager.run_beside(NodeWatch::default().run(manager.store().clone()));
    Ok(())
}
