//! Request bodies into JSON values under a budget: at most [`MAX_JSON_VALUES`] values (every
//! number, string, array, object and key counts one), refused while parsing, before they are
//! built. A body within the size limit can otherwise hold millions of tiny values (`[0,0,0,…]`,
//! 200,000 empty messages), each tens of bytes once parsed: the body limit alone bounds the
//! bytes read, not the memory they become.
//!
//! This file owns that budget only; what the values mean is `request`'s business.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value as Json};
use std::cell::Cell;
use std::fmt;

/// The most JSON values one body may hold: room for a token-id prompt filling a 128K context,
/// 2,048 messages of a few fields each, or 128 tool schemas, at a few tens of MiB parsed.
pub const MAX_JSON_VALUES: usize = 1 << 18;

/// Why a body is refused.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Not one JSON value: serde_json's message, with the line and column.
    #[error("the request body is not valid JSON: {0}")]
    Syntax(String),
    /// Valid so far, but past the budget.
    #[error("the request body holds more than {0} JSON values (the limit per request)")]
    TooManyValues(usize),
}

/// Parses `bytes` as one JSON value of at most `max_values` values.
pub fn parse(bytes: &[u8], max_values: usize) -> Result<Json, BodyError> {
    let budget = Cell::new(max_values);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = Budgeted { budget: &budget }
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value));
    parsed.map_err(|e| {
        if budget.get() == 0 {
            BodyError::TooManyValues(max_values)
        } else {
            BodyError::Syntax(e.to_string())
        }
    })
}

/// Hands freed heap memory back to the system. glibc keeps what a large request freed in its
/// per-thread arenas, so a burst of large bodies would leave the server's resident memory at
/// its peak for good; elsewhere the allocator is left to itself.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Fixes glibc's threshold for serving an allocation by its own mapping at 256 KiB. By default
/// glibc raises that threshold to the size of each large block freed (up to 32 MiB), after which
/// a large request's buffers come from the arenas and stay resident once freed; with the
/// threshold fixed, every large buffer is unmapped when freed.
pub fn keep_large_allocations_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets an allocator parameter; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// One value, charged to the shared budget.
#[derive(Clone, Copy)]
struct Budgeted<'a> {
    budget: &'a Cell<usize>,
}

impl Budgeted<'_> {
    fn charge<E: serde::de::Error>(&self) -> Result<(), E> {
        match self.budget.get() {
            // The message is replaced by `BodyError::TooManyValues`.
            0 => Err(E::custom("over budget")),
            left => {
                self.budget.set(left - 1);
                Ok(())
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for Budgeted<'_> {
    type Value = Json;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Budgeted<'_> {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Json, E> {
        self.charge()?;
        Ok(Json::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Json, E> {
        self.charge()?;
        Ok(Json::Number(v.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Json, E> {
        self.charge()?;
        Ok(Json::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Json, E> {
        self.charge()?;
        // JSON has no NaN or infinity, so the parser never hands one over.
        Ok(Number::from_f64(v).map_or(Json::Null, Json::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Json, E> {
        self.charge()?;
        Ok(Json::String(v.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Json, E> {
        self.charge()?;
        Ok(Json::String(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Json, E> {
        self.charge()?;
        Ok(Json::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Json, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        self.charge()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        self.charge()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.charge()?;
            // A repeated key replaces the earlier value, as serde_json and Python's json do.
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Json::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_within_the_budget_parses_like_serde_json() {
        let text = r#"{"a": [1, -2, 3.5, "x", null, true, {"b": {}}], "c": "é\n", "d": 18446744073709551615}"#;
        let expected: Json = serde_json::from_str(text).unwrap();
        assert_eq!(parse(text.as_bytes(), 100).unwrap(), expected);
    }

    #[test]
    fn every_value_and_key_counts_against_the_budget() {
        // The object, its key, the array and three numbers: 6 values.
        assert!(parse(br#"{"a": [1, 2, 3]}"#, 6).is_ok());
        let err = parse(br#"{"a": [1, 2, 3]}"#, 5).unwrap_err();
        assert!(err.to_string().contains("more than 5 JSON values"), "{err}");
    }

    #[test]
    fn a_huge_flat_array_is_refused_before_it_is_built() {
        let body = format!("[{}0]", "0,".repeat(1_000_000));
        let err = parse(body.as_bytes(), MAX_JSON_VALUES).unwrap_err();
        assert!(matches!(err, BodyError::TooManyValues(MAX_JSON_VALUES)), "{err}");
    }

    #[test]
    fn trailing_bytes_are_refused_and_a_repeated_key_keeps_its_last_value() {
        assert!(matches!(parse(b"{} x", 10), Err(BodyError::Syntax(_))));
        assert!(matches!(parse(b"[1, 2", 10), Err(BodyError::Syntax(_))));
        assert_eq!(parse(br#"{"a": 1, "a": 2}"#, 10).unwrap(), serde_json::json!({"a": 2}));
    }
}
