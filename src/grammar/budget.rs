//! The size and depth budget a JSON schema must fit before it reaches llguidance.
//!
//! llguidance compiles a schema recursively, following each `$ref` into its target, so a schema
//! whose references chain hundreds deep (a few kilobytes of JSON) exhausts a thread's stack,
//! which aborts the whole process; a server compiles what any client sends. This file measures a
//! schema the way that compiler walks it, every level of nesting and every `$ref` hop one step
//! deeper, and refuses one past [`MAX_SCHEMA_DEPTH`] or [`MAX_SCHEMA_NODES`] with the path where
//! it went too deep. It must not judge what a schema means: llguidance does that.
//!
//! The walk recurses at most [`MAX_SCHEMA_DEPTH`] frames itself (it stops there), and a
//! reference's target is measured once however often it is used, so a schema of diamonds
//! (`a` refers to `b` twice, `b` to `c` twice, ...) costs what its text costs.

use serde_json::Value as Json;
use std::collections::HashMap;

/// How deep a schema may nest, counting each object or array level and each `$ref` hop. Real
/// schemas (OpenAI's structured-output limit is 10 levels of nesting; tool schemas a handful)
/// are far below it, and the compiler's stack use at this depth is a few hundred kilobytes.
pub const MAX_SCHEMA_DEPTH: usize = 128;

/// How many JSON values a schema may hold, its references' targets counted once each. A
/// request body already stops at 262,144 values; this bounds a schema given to the CLI too.
pub const MAX_SCHEMA_NODES: usize = 100_000;

/// Why a schema is over the budget: what was exceeded and where (a JSON pointer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} (at {at})")]
pub struct SchemaBudgetError {
    /// The limit that was passed, with its value.
    pub what: String,
    /// Where in the schema: a JSON pointer, through `$ref`s as written.
    pub at: String,
}

/// Checks `schema` against [`MAX_SCHEMA_DEPTH`] and [`MAX_SCHEMA_NODES`].
pub fn check_schema(schema: &Json) -> Result<(), SchemaBudgetError> {
    Walk {
        root: schema,
        heights: HashMap::new(),
        nodes: 0,
        path: Vec::new(),
    }
    .height(schema, 0)
    .map(drop)
}

struct Walk<'a> {
    root: &'a Json,
    /// The height of each reference's target already measured (a reference met again while
    /// its own target is being measured, a recursive schema, counts 0 there).
    heights: HashMap<&'a str, Option<usize>>,
    nodes: usize,
    /// The keys and `$ref`s from the top to the value being measured, for the error.
    path: Vec<String>,
}

impl<'a> Walk<'a> {
    fn refuse(&self, what: String) -> SchemaBudgetError {
        let at = if self.path.is_empty() {
            "the top".to_string()
        } else {
            // The start and the end of a long path: where it began and where it went too deep.
            let n = self.path.len();
            let steps = |range: std::ops::Range<usize>| -> String {
                self.path[range].iter().map(|p| format!("/{p}")).collect()
            };
            if n > 6 {
                format!("{}/…{} ({n} steps)", steps(0..3), steps(n - 3..n))
            } else {
                steps(0..n)
            }
        };
        SchemaBudgetError { what, at }
    }

    fn too_deep(&self) -> SchemaBudgetError {
        self.refuse(format!(
            "the schema nests (objects, arrays and $ref hops together) more than {MAX_SCHEMA_DEPTH} levels deep"
        ))
    }

    /// How many levels `value` reaches below itself, `depth` being its own level.
    fn height(&mut self, value: &'a Json, depth: usize) -> Result<usize, SchemaBudgetError> {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(self.too_deep());
        }
        self.nodes += 1;
        if self.nodes > MAX_SCHEMA_NODES {
            return Err(self.refuse(format!("the schema holds more than {MAX_SCHEMA_NODES} values")));
        }
        let children: Box<dyn Iterator<Item = (String, &'a Json)>> = match value {
            Json::Object(map) => Box::new(map.iter().map(|(k, v)| (k.clone(), v))),
            Json::Array(items) => Box::new(items.iter().enumerate().map(|(i, v)| (i.to_string(), v))),
            _ => return Ok(0),
        };
        let mut height = 0;
        for (key, child) in children {
            let below = match (key.as_str(), child) {
                ("$ref", Json::String(reference)) => {
                    self.path.push(format!("$ref:{reference}"));
                    self.reference(reference, depth)?
                }
                _ => {
                    self.path.push(key);
                    1 + self.height(child, depth + 1)?
                }
            };
            self.path.pop();
            height = height.max(below);
        }
        Ok(height)
    }

    /// The height a `$ref` adds: one hop plus its target's height. Only references inside the
    /// document (`#`, `#/json/pointer`) are followed; llguidance refuses any other.
    fn reference(&mut self, reference: &'a str, depth: usize) -> Result<usize, SchemaBudgetError> {
        let Some(pointer) = reference.strip_prefix('#') else {
            return Ok(0);
        };
        match self.heights.get(reference) {
            Some(Some(height)) => {
                if depth + 1 + height > MAX_SCHEMA_DEPTH {
                    return Err(self.too_deep());
                }
                return Ok(1 + height);
            }
            // Being measured: a recursive schema, whose depth is the generation's, not the
            // compiler's.
            Some(None) => return Ok(0),
            None => {}
        }
        let Some(target) = self.root.pointer(pointer) else {
            return Ok(0);
        };
        self.heights.insert(reference, None);
        let height = self.height(target, depth + 1)?;
        self.heights.insert(reference, Some(height));
        Ok(1 + height)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `{"$ref": "#/$defs/d0"}` with `d0` → `d1` → ... → `d{n-1}` → a string.
    fn chain(n: usize) -> Json {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                json!({"$ref": format!("#/$defs/d{}", i + 1)})
            } else {
                json!({"type": "string"})
            };
            defs.insert(format!("d{i}"), next);
        }
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    #[test]
    fn a_chain_of_references_past_the_limit_is_refused_naming_where() {
        check_schema(&chain(40)).unwrap();
        let e = check_schema(&chain(700)).unwrap_err();
        assert!(e.what.contains("more than 128 levels"), "{e}");
        assert!(e.at.starts_with("/$ref:#/$defs/d0/$ref:#/$defs/d1/"), "{e}");
        assert!(e.at.ends_with("(129 steps)"), "{e}");
    }

    #[test]
    fn recursive_schemas_and_repeated_references_are_measured_once() {
        // A tree: recursive through "#".
        check_schema(&json!({"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}}))
            .unwrap();
        // Diamonds: 40 definitions each using the next twice would be 2^40 paths unmemoised.
        let mut defs = serde_json::Map::new();
        for i in 0..40 {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            defs.insert(format!("d{i}"), json!({"anyOf": [next.clone(), next]}));
        }
        defs.insert("d40".into(), json!({"type": "integer"}));
        check_schema(&json!({"$ref": "#/$defs/d0", "$defs": defs})).unwrap();
    }

    #[test]
    fn plain_nesting_counts_too_and_size_is_bounded() {
        let mut deep = json!({"type": "string"});
        for _ in 0..70 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        assert!(check_schema(&deep).is_err());
        let wide = Json::Array((0..MAX_SCHEMA_NODES).map(|i| json!(i)).collect());
        assert!(check_schema(&json!({"enum": wide}))
            .unwrap_err()
            .what
            .contains("values"));
    }
}
