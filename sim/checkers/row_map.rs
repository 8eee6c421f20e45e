//! Values by row id for the checkers that look a row up per commit: a vector indexed by the id where
//! ids are dense, a `BTreeMap` elsewhere.
//!
//! The simulator's MemStore gives ids 1, 2, 3, … in insert order, and a PostgreSQL sequence counts from 1 too, so
//! nearly every id is a small positive number. A lookup by index costs a bounds check where a `BTreeMap<RowId, _>`
//! of 10 000 rows walks four nodes: after a 10 000-row run, `lease_exclusivity` alone spent 2.5 % of the seed's
//! instructions on such lookups (docs/benchmarks-history.md, "Simulator: judging after the run").

use crate::store::RowId;
use std::collections::BTreeMap;

/// Largest id kept in the vector: 1 048 576, so the vector of a history with huge ids stays bounded (24 MB for a
/// value of 24 bytes). Ids above it, and ids below 1, go to the map; each id lives in exactly one of the two.
pub const DENSE_IDS_MAX: i64 = 1 << 20;

/// Values by row id. Iteration is in id order, as a `BTreeMap<RowId, T>`'s.
#[derive(Clone, Debug)]
pub struct RowMap<T> {
    /// The value of id `i` (1 ≤ i ≤ [`DENSE_IDS_MAX`]) at index `i − 1`; grown to the largest such id inserted.
    dense: Vec<Option<T>>,
    /// The values of every other id.
    sparse: BTreeMap<RowId, T>,
}

impl<T> Default for RowMap<T> {
    fn default() -> Self {
        RowMap { dense: Vec::new(), sparse: BTreeMap::new() }
    }
}

/// The vector index of `id`, if it is one of the dense ids.
fn dense_index(id: RowId) -> Option<usize> {
    (1..=DENSE_IDS_MAX).contains(&id.0).then(|| (id.0 - 1) as usize)
}

impl<T> RowMap<T> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `id`, if any.
    pub fn get(&self, id: RowId) -> Option<&T> {
        match dense_index(id) {
            Some(index) => self.dense.get(index)?.as_ref(),
            None => self.sparse.get(&id),
        }
    }

    /// The value of `id` to change, if any.
    pub fn get_mut(&mut self, id: RowId) -> Option<&mut T> {
        match dense_index(id) {
            Some(index) => self.dense.get_mut(index)?.as_mut(),
            None => self.sparse.get_mut(&id),
        }
    }

    /// Whether `id` has a value.
    pub fn contains(&self, id: RowId) -> bool {
        self.get(id).is_some()
    }

    /// Sets the value of `id`; returns the one it replaced.
    pub fn insert(&mut self, id: RowId, value: T) -> Option<T> {
        match dense_index(id) {
            Some(index) => self.slot(index).replace(value),
            None => self.sparse.insert(id, value),
        }
    }

    /// Removes the value of `id`; returns it.
    pub fn remove(&mut self, id: RowId) -> Option<T> {
        match dense_index(id) {
            Some(index) => self.dense.get_mut(index)?.take(),
            None => self.sparse.remove(&id),
        }
    }

    /// The value of `id` to change, set to `make()` first if it has none.
    pub fn get_or_insert_with(&mut self, id: RowId, make: impl FnOnce() -> T) -> &mut T {
        match dense_index(id) {
            Some(index) => self.slot(index).get_or_insert_with(make),
            None => self.sparse.entry(id).or_insert_with(make),
        }
    }

    /// Every id and its value, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (RowId, &T)> {
        let below = self.sparse.range(..RowId(1)).map(|(id, value)| (*id, value));
        let dense =
            self.dense.iter().enumerate().filter_map(|(index, value)| Some((RowId(index as i64 + 1), value.as_ref()?)));
        let above = self.sparse.range(RowId(1)..).map(|(id, value)| (*id, value));
        below.chain(dense).chain(above)
    }

    /// The vector's slot at `index`, the vector grown to hold it.
    fn slot(&mut self, index: usize) -> &mut Option<T> {
        if index >= self.dense.len() {
            self.dense.resize_with(index + 1, || None);
        }
        &mut self.dense[index]
    }
}

impl<T> FromIterator<(RowId, T)> for RowMap<T> {
    fn from_iter<I: IntoIterator<Item = (RowId, T)>>(pairs: I) -> Self {
        let mut map = RowMap::new();
        for (id, value) in pairs {
            map.insert(id, value);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_ids_read_back_and_iterate_in_id_order() {
        let ids = [5, DENSE_IDS_MAX + 1, 1, -3, 0, DENSE_IDS_MAX, i64::MAX, i64::MIN];
        let mut map: RowMap<i64> = ids.iter().map(|id| (RowId(*id), id.wrapping_mul(2))).collect();
        for id in ids {
            assert_eq!(map.get(RowId(id)), Some(&id.wrapping_mul(2)), "id {id}");
        }
        assert_eq!(map.get(RowId(2)), None, "a hole in the vector");
        assert_eq!(map.get(RowId(DENSE_IDS_MAX + 2)), None);
        let mut sorted = ids;
        sorted.sort();
        assert_eq!(map.iter().map(|(id, _)| id.0).collect::<Vec<_>>(), sorted);
        assert_eq!(map.insert(RowId(5), 1), Some(10));
        assert_eq!(map.remove(RowId(-3)), Some(-6));
        assert!(!map.contains(RowId(-3)));
        *map.get_or_insert_with(RowId(7), || 0) += 3;
        *map.get_or_insert_with(RowId(7), || 0) += 3;
        assert_eq!(map.get(RowId(7)), Some(&6));
        assert!(map.dense.len() <= DENSE_IDS_MAX as usize, "the vector stays bounded");
    }
}
