//! What one task keeps in memory about its windowed operators: each one's [`Meta`] (observed
//! time, late events, sequence), read from its store when first needed and written back after
//! each batch, and the earliest time at which something of it may close or expire.

use super::graph::{Event, Node, store_of};
use super::layout::{META, Meta};
use crate::processor::{Context, ProcessError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The windowed operators' bookkeeping of one task, by node.
pub(crate) struct Bookkeeping {
    /// Windowed operators' bookkeeping, read from their stores when first needed and written
    /// back after each batch.
    metas: BTreeMap<usize, Meta>,
    /// Per windowed operator, the earliest time at which something may close or expire
    /// (`None`: unknown, look). Derived from the store; never persisted.
    next_due: BTreeMap<usize, Option<i64>>,
    /// Counts late events in the engine's metrics (`late_records`).
    late_metric: Arc<dyn Fn(u64) + Send + Sync>,
}

impl Bookkeeping {
    pub fn new(late_metric: Arc<dyn Fn(u64) + Send + Sync>) -> Bookkeeping {
        Bookkeeping { metas: BTreeMap::new(), next_due: BTreeMap::new(), late_metric }
    }

    /// The operator's bookkeeping, from the store the first time.
    pub fn meta(
        &mut self,
        node: usize,
        store: &str,
        ctx: &mut Context<'_>,
    ) -> Result<Meta, ProcessError> {
        if let Some(meta) = self.metas.get(&node) {
            return Ok(*meta);
        }
        let meta = match ctx.store(store)?.get(META)? {
            None => Meta::NEW,
            Some(bytes) => Meta::decode(&bytes).ok_or_else(|| {
                ProcessError::new(format!("store {store}: its bookkeeping entry is not 24 bytes"))
            })?,
        };
        self.metas.insert(node, meta);
        Ok(meta)
    }

    /// The operator's bookkeeping, already read with [`Bookkeeping::meta`].
    pub fn loaded(&self, node: usize) -> Meta {
        self.metas[&node]
    }

    pub fn set_meta(&mut self, node: usize, meta: Meta) {
        self.metas.insert(node, meta);
    }

    /// A late event: counted, and sent to the operator's late topic if it has one.
    pub fn late(
        &mut self,
        node: usize,
        late_to: Option<&String>,
        event: Event,
        ctx: &mut Context<'_>,
    ) {
        if let Some(meta) = self.metas.get_mut(&node) {
            meta.late += 1;
        }
        (self.late_metric)(1);
        if let Some(topic) = late_to {
            ctx.emit_with(topic, event.key, event.value, Some(event.timestamp), Vec::new());
        }
    }

    /// Whether something of `node` may close or expire at `observed`.
    pub fn is_due(&self, node: usize, observed: i64) -> bool {
        match self.next_due.get(&node) {
            None => true,
            Some(None) => false,
            Some(Some(due)) => *due <= observed,
        }
    }

    /// Something of `node` may be due at `time`.
    pub fn due(&mut self, node: usize, time: i64) {
        match self.next_due.get_mut(&node) {
            None => {}
            Some(due @ None) => *due = Some(time),
            Some(Some(due)) => *due = (*due).min(time),
        }
    }

    /// The earliest time at which something of `node` may close or expire, as a scan of its
    /// store found it (`None`: nothing).
    pub fn set_next_due(&mut self, node: usize, next: Option<i64>) {
        self.next_due.insert(node, next);
    }

    /// Write each operator's bookkeeping back to its store (`nodes`: the plan's).
    pub fn save(&self, nodes: &[Node], ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        for (&node, meta) in &self.metas {
            let Some(store) = store_of(&nodes[node].op) else { continue };
            ctx.store(store)?.put(META, &meta.encode());
        }
        Ok(())
    }
}
