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
        // A typed view keeps nothing of its own, so the store it borrows must be whole.
        assert!(store.disk.is_none() || store.data.is_empty(), "a disk store keeps no map");
        Typed { store, types: std::marker::PhantomData }
    }
}

impl<K, V> Typed<'_, K, V>
where
    K: serde::Serialize + serde::de::DeserializeOwned,
    V: serde::Serialize + serde::de::DeserializeOwned,
{
    pub fn get(&self, key: &K) -> Result<Option<V>, ProcessError> {
        let key = encode(key)?;
        // Per call, so debug only: JSON text is never empty, so no typed key is the empty key
        // (which untyped access may use).
        debug_assert!(!key.is_empty(), "a typed key encodes to JSON text");
        self.store.get(&key)?.map(|v| decode(&v)).transpose()
    }

    pub fn put(&mut self, key: &K, value: &V) -> Result<(), ProcessError> {
        let (key, value) = (encode(key)?, encode(value)?);
        // Per record, so debug only: what is stored decodes back to the caller's types (the
        // serde round trip a later `get` or `iter` relies on), and reads back as written.
        debug_assert!(decode::<K>(&key).is_ok(), "a typed key decodes from its encoding");
        debug_assert!(decode::<V>(&value).is_ok(), "a typed value decodes from its encoding");
        self.store.put(&key, &value);
        debug_assert!(
            self.store.dirty.get(&key).is_some_and(|v| v.get(1..) == Some(&value[..])),
            "a typed put is the store's change under the encoded key"
        );
        Ok(())
    }

    /// Remove `key`, blind (see [`Store::delete`]).
    pub fn delete(&mut self, key: &K) -> Result<(), ProcessError> {
        let key = encode(key)?;
        debug_assert!(decode::<K>(&key).is_ok(), "a typed key decodes from its encoding");
        self.store.delete(&key);
        debug_assert!(
            self.store.dirty.get(&key).is_some_and(Vec::is_empty),
            "a typed delete is the store's change under the encoded key"
        );
        Ok(())
    }

    /// Every entry, in the order of the encoded keys.
    pub fn iter(&self) -> impl Iterator<Item = Result<(K, V), ProcessError>> + '_ {
        self.store.iter().map(|entry| {
            let (k, v) = entry.map_err(|e| ProcessError::new(e.to_string()))?;
            Ok((decode(&k)?, decode(&v)?))
        })
    }

    /// See [`Store::len_estimate`].
    pub fn len_estimate(&self) -> u64 {
        self.store.len_estimate()
    }

    /// See [`Store::count`].
    pub fn count(&self) -> Result<u64, ProcessError> {
        self.store.count().map_err(|e| ProcessError::new(e.to_string()))
    }

    /// See [`Store::is_empty`].
    pub fn is_empty(&self) -> Result<bool, ProcessError> {
        self.store.is_empty().map_err(|e| ProcessError::new(e.to_string()))
    }
}
