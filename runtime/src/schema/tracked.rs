//! Arguments read once, by one deserializer that knows where it is: the top-level field it is
//! in, and on demand the path inside it.
//!
//! A tool's arguments type is read through [`Fields`] alone, whether the read succeeds or not,
//! so its derived visitor is compiled once per tool, not once for the read and again for a
//! path-tracking read of the same arguments after a failure. A [`read`] deserializes each
//! field's value as serde_json does; only arguments it refused are read again by [`locate`],
//! with each value wrapped by `serde_path_to_error`, which costs allocations on the way and
//! names the path inside the field (`lines[2].sku`). That wrapping is generic over the field's
//! type, which tools share, not over the arguments type.

use std::cell::Cell;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde_json::{Map, Value};

/// Where a failed read was: `.` for the arguments as a whole (a missing field), else the
/// field's name and the path inside it, as `serde_path_to_error` writes paths.
pub(super) struct Failure {
    pub path: String,
    pub error: serde_json::Error,
}

/// Reads `A` from `args`, as serde_json reads it from their value.
pub(super) fn read<A: de::DeserializeOwned>(
    args: &Map<String, Value>,
) -> Result<A, serde_json::Error> {
    let at = Cell::new(None);
    A::deserialize(Fields {
        args,
        at: &at,
        inner: None,
    })
}

/// Reads `A` from `args` tracking where it fails: for arguments a [`read`] refused.
pub(super) fn locate<A: de::DeserializeOwned>(args: &Map<String, Value>) -> Result<A, Failure> {
    let (at, inner) = (Cell::new(None), Cell::new(None));
    A::deserialize(Fields {
        args,
        at: &at,
        inner: Some(&inner),
    })
    .map_err(|error| {
        let path = match (at.get(), inner.take()) {
            (None, _) => ".".to_string(),
            (Some(field), inner) => super::join_path(field, inner.as_deref().unwrap_or(".")),
        };
        Failure { path, error }
    })
}

/// The arguments as a deserializer: a map, and nothing else (a struct's visitor for a
/// sequence is never called, so never compiled).
struct Fields<'de, 'c> {
    args: &'de Map<String, Value>,
    /// The field being read; `None` before the first and after the last.
    at: &'c Cell<Option<&'de str>>,
    /// When locating a failure: where the path inside the field at fault goes.
    inner: Option<&'c Cell<Option<String>>>,
}

impl<'de> de::Deserializer<'de> for Fields<'de, '_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_map(Entries {
            iter: self.args.iter(),
            value: None,
            at: self.at,
            inner: self.inner,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

struct Entries<'de, 'c> {
    iter: serde_json::map::Iter<'de>,
    value: Option<&'de Value>,
    at: &'c Cell<Option<&'de str>>,
    inner: Option<&'c Cell<Option<String>>>,
}

impl<'de> MapAccess<'de> for Entries<'de, '_> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.iter.next() {
            Some((key, value)) => {
                // Set first: an unknown field fails on its name, and is named.
                self.at.set(Some(key));
                self.value = Some(value);
                let key = de::value::BorrowedStrDeserializer::<serde_json::Error>::new(key);
                seed.deserialize(key).map(Some)
            }
            None => {
                self.at.set(None);
                Ok(None)
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value was read before its field's name"))?;
        let Some(inner) = self.inner else {
            return seed.deserialize(value);
        };
        let mut track = serde_path_to_error::Track::new();
        let read = seed.deserialize(serde_path_to_error::Deserializer::new(value, &mut track));
        if read.is_err() {
            inner.set(Some(track.path().to_string()));
        }
        read
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}
