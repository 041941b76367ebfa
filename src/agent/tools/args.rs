//! Argument access for model tool calls: alias-tolerant, typed, with errors the model can act on.
//!
//! Models emit the same argument under many spellings (`file_path`, `filePath`, `path`…), so
//! every lookup takes a list of aliases, tried exactly first and then with case, `_` and `-`
//! ignored.

use serde_json::{Map, Value};

use super::call::ToolError;

/// Aliases for the common arguments.
pub(crate) const PATH: &[&str] = &[
    "path",
    "file_path",
    "target_file",
    "filePath",
    "filename",
    "file",
];
pub(crate) const OFFSET: &[&str] = &["offset", "start_line", "line", "start", "line_offset"];
pub(crate) const LIMIT: &[&str] = &["limit", "max_lines", "line_count", "lines", "num_lines"];

/// A tool call's arguments object.
pub(crate) struct Args {
    tool: String,
    map: Map<String, Value>,
}

/// Lower-case, letters and digits only: the key under which aliases meet.
pub(crate) fn norm(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl Args {
    /// Accept an object, a JSON string holding an object (some models double-encode), or
    /// nothing (`null` means no arguments).
    pub(crate) fn parse(tool: &str, value: &Value) -> Result<Args, ToolError> {
        let map = match value {
            Value::Object(m) => m.clone(),
            Value::Null => Map::new(),
            Value::String(s) if s.trim().is_empty() => Map::new(),
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(m)) => m,
                Ok(_) => return Err(invalid(tool, "the arguments must be a JSON object")),
                Err(e) => {
                    return Err(invalid(
                        tool,
                        &format!("the arguments are not valid JSON ({e}); send a JSON object"),
                    ))
                }
            },
            _ => return Err(invalid(tool, "the arguments must be a JSON object")),
        };
        Ok(Args {
            tool: tool.to_string(),
            map,
        })
    }

    pub(crate) fn map(&self) -> &Map<String, Value> {
        &self.map
    }

    pub(crate) fn error(&self, message: impl Into<String>) -> ToolError {
        invalid(&self.tool, &message.into())
    }

    /// The value under the first alias present; `null` counts as absent.
    pub(crate) fn get(&self, keys: &[&str]) -> Option<&Value> {
        let found = keys.iter().find_map(|k| self.map.get(*k)).or_else(|| {
            let wanted: Vec<String> = keys.iter().map(|k| norm(k)).collect();
            wanted
                .iter()
                .find_map(|w| self.map.iter().find(|(k, _)| norm(k) == *w).map(|(_, v)| v))
        });
        found.filter(|v| !v.is_null())
    }

    /// An optional string. Numbers and booleans are accepted as their text.
    pub(crate) fn str_opt(&self, keys: &[&str]) -> Result<Option<String>, ToolError> {
        match self.get(keys) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(Value::Bool(b)) => Ok(Some(b.to_string())),
            Some(_) => Err(self.error(format!("`{}` must be a string", keys[0]))),
        }
    }

    /// A required string; `shape` says what it should hold, for the error message.
    pub(crate) fn str_req(&self, keys: &[&str], shape: &str) -> Result<String, ToolError> {
        self.str_opt(keys)?
            .ok_or_else(|| self.error(format!("missing required argument `{}` ({shape})", keys[0])))
    }

    /// A required, non-blank string.
    pub(crate) fn str_nonblank(&self, keys: &[&str], shape: &str) -> Result<String, ToolError> {
        let s = self.str_req(keys, shape)?;
        if s.trim().is_empty() {
            return Err(self.error(format!("`{}` must not be empty ({shape})", keys[0])));
        }
        Ok(s)
    }

    /// An optional integer; integral floats and numeric strings are accepted.
    pub(crate) fn int_opt(&self, keys: &[&str]) -> Result<Option<i64>, ToolError> {
        let bad = || self.error(format!("`{}` must be an integer", keys[0]));
        match self.get(keys) {
            None => Ok(None),
            Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Ok(Some(i)),
                (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
                _ => Err(bad()),
            },
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => s.trim().parse::<i64>().map(Some).map_err(|_| bad()),
            Some(_) => Err(bad()),
        }
    }

    /// An optional integer that must fit `lo..=hi`.
    pub(crate) fn int_in(&self, keys: &[&str], lo: i64, hi: i64) -> Result<Option<i64>, ToolError> {
        match self.int_opt(keys)? {
            Some(v) if v < lo || v > hi => Err(self.error(format!(
                "`{}` must be between {lo} and {hi} (got {v})",
                keys[0]
            ))),
            v => Ok(v),
        }
    }

    /// An optional boolean; "true"/"false" strings and 0/1 are accepted.
    pub(crate) fn bool_opt(&self, keys: &[&str]) -> Result<Option<bool>, ToolError> {
        match self.get(keys) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "1" => Ok(Some(true)),
                "false" | "no" | "0" | "" => Ok(Some(false)),
                _ => Err(self.error(format!("`{}` must be true or false", keys[0]))),
            },
            Some(Value::Number(n)) if n.as_i64() == Some(0) || n.as_i64() == Some(1) => {
                Ok(Some(n.as_i64() == Some(1)))
            }
            Some(_) => Err(self.error(format!("`{}` must be true or false", keys[0]))),
        }
    }

    /// An optional list of strings; a single string counts as a list of one, and a string
    /// holding a JSON array is unpacked.
    pub(crate) fn str_list_opt(&self, keys: &[&str]) -> Result<Option<Vec<String>>, ToolError> {
        let bad = || self.error(format!("`{}` must be an array of strings", keys[0]));
        match self.get(keys) {
            None => Ok(None),
            Some(Value::String(s)) => {
                if s.trim_start().starts_with('[') {
                    if let Ok(Value::Array(items)) = serde_json::from_str::<Value>(s) {
                        return strings(&items).ok_or_else(bad).map(Some);
                    }
                }
                Ok(if s.trim().is_empty() {
                    Some(Vec::new())
                } else {
                    Some(vec![s.clone()])
                })
            }
            Some(Value::Array(items)) => strings(items).ok_or_else(bad).map(Some),
            Some(_) => Err(bad()),
        }
    }
}

fn strings(items: &[Value]) -> Option<Vec<String>> {
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect()
}

pub(crate) fn invalid(tool: &str, message: &str) -> ToolError {
    ToolError::InvalidArgs {
        tool: tool.to_string(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Args {
        Args::parse("t", &v).unwrap()
    }

    #[test]
    fn aliases_match_exactly_then_loosely() {
        let a = args(json!({"filePath": "a.rs", "Old-String": "x"}));
        assert_eq!(a.str_opt(PATH).unwrap().as_deref(), Some("a.rs"));
        assert_eq!(a.str_opt(&["old_string"]).unwrap().as_deref(), Some("x"));
        // The first alias wins when several are present.
        let a = args(json!({"file": "b", "path": "a"}));
        assert_eq!(a.str_opt(PATH).unwrap().as_deref(), Some("a"));
    }

    #[test]
    fn arguments_may_arrive_as_a_json_string_or_nothing() {
        let a = Args::parse("t", &json!("{\"path\":\"x\"}")).unwrap();
        assert_eq!(a.str_opt(PATH).unwrap().as_deref(), Some("x"));
        assert!(Args::parse("t", &Value::Null).unwrap().map().is_empty());
        let e = Args::parse("t", &json!("{oops")).err().unwrap().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        assert!(Args::parse("t", &json!([1])).is_err());
    }

    #[test]
    fn typed_accessors_are_lenient_but_strict_on_nonsense() {
        let a =
            args(json!({"n": "12", "f": 3.0, "b": "true", "l": "x", "bad": {"a": 1}, "z": null}));
        assert_eq!(a.int_opt(&["n"]).unwrap(), Some(12));
        assert_eq!(a.int_opt(&["f"]).unwrap(), Some(3));
        assert_eq!(a.bool_opt(&["b"]).unwrap(), Some(true));
        assert_eq!(a.str_list_opt(&["l"]).unwrap(), Some(vec!["x".to_string()]));
        assert_eq!(a.str_opt(&["z"]).unwrap(), None);
        let e = a.int_opt(&["bad"]).unwrap_err().to_string();
        assert_eq!(e, "Invalid arguments for `t`: `bad` must be an integer");
        let e = a
            .str_req(&["path"], "string: the file")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "Invalid arguments for `t`: missing required argument `path` (string: the file)"
        );
        assert!(a.int_in(&["n"], 0, 10).is_err());
    }
}
