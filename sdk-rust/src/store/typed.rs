//! A store seen through serde ([`Typed`]): keys and values of the caller's types, encoded as
//! JSON by the processor's codec, so a typed store, `Context::emit_json` and
//! `processor::decode` agree on bytes. It keeps nothing of its own: every call encodes and
//! goes to the borrowed [`Store`], so typed and untyped access to one store see one state.

use super::Store;
use crate::processor::error::{ProcessError, decode, encode};

/// A store seen through serde: keys and values of your own types, encoded as JSON. Keys are
/// ordered by their encoding (for strings and non-negative integers of one width, their own
/// order). Get one with [`Context::typed`] or [`Store::typed`].
///
/// [`Context::typed`]: crate::processor::Context::typed
#[derive(Debug)]
pub struct Typed<'a, K, V> {
    store: &'a mut Store,
    types: std::marker::PhantomData<fn(K, V)>,
}

impl<'a, K, V> Typed<'a, K, V> {
    pub(crate) fn new(store: &'a mut Store) -> Typed<'a, K, V> {
        Typed { store, types: std::marker::PhantomData }
    }
}

impl<K, V> Typed<'_, K, V>
where
    K: serde::Serialize + serde::de::DeserializeOwned,
    V: serde::Serialize + serde::de::DeserializeOwned,
{
    pub fn get(&self, key: &K) -> Result<Option<V>, ProcessError> {
        self.store.get(&encode(key)?).map(|v| decode(&v)).transpose()
    }

    pub fn put(&mut self, key: &K, value: &V) -> Result<(), ProcessError> {
        self.store.put(&encode(key)?, &encode(value)?);
        Ok(())
    }

    /// Remove `key`; returns whether it was there.
    pub fn delete(&mut self, key: &K) -> Result<bool, ProcessError> {
        Ok(self.store.delete(&encode(key)?))
    }

    /// Every entry, in the order of the encoded keys.
    pub fn iter(&self) -> impl Iterator<Item = Result<(K, V), ProcessError>> + '_ {
        self.store.iter().map(|entry| {
            let (k, v) = entry.map_err(|e| ProcessError::new(e.to_string()))?;
            Ok((decode(&k)?, decode(&v)?))
        })
    }

    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }
}
