//! Tool schemas and names every provider accepts.
//!
//! Our tools and MCP tools arrive with whatever JSON Schema their authors wrote. Before a request
//! is built, one normalisation step per [`Dialect`] (a provider kind, or a known endpoint quirk)
//! rewrites them: object schemas always carry `type: "object"` (and `properties`, where the
//! provider allows it), `$ref`s are inlined, tuple arrays become `anyOf` items, keywords the
//! provider refuses are rewritten or dropped, and tool names are made valid. [`ToolNames`] maps the
//! names back when the model calls a tool.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::types::{AssistantPart, Message, ProviderRequest};
use super::ProviderKind;

/// Longest tool name every dialect accepts.
pub(crate) const MAX_TOOL_NAME: usize = 64;
/// `$ref`s are inlined this deep; a recursive schema ends in an unconstrained node there.
const MAX_REF_DEPTH: usize = 4;

/// Which provider's schema and naming rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI Chat / Responses and generic compatibles: names `^[a-zA-Z0-9_-]{1,64}$`, no tuple
    /// `items`.
    OpenAi,
    /// Anthropic Messages: names `^[a-zA-Z0-9_-]{1,64}$`, draft 2020-12 (no tuple `items`).
    Anthropic,
    /// Gemini native: names start with a letter or `_`, then `[a-zA-Z0-9_.:-]`, at most 64;
    /// schemas in its OpenAPI 3 subset.
    Gemini,
    /// Gemini's OpenAI-compatible endpoint: Gemini's schema subset behind OpenAI's tool format;
    /// names valid for both.
    GeminiOpenAi,
    /// Kimi / Moonshot: every schema node needs a `type` (objects `type: "object"`).
    Moonshot,
}

impl Dialect {
    /// The dialect for an endpoint of `kind` at `base_url`.
    pub fn for_endpoint(kind: ProviderKind, base_url: &str) -> Dialect {
        let host = reqwest::Url::parse(base_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_default();
        let on = |domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
        match kind {
            ProviderKind::Gemini => Dialect::Gemini,
            ProviderKind::Anthropic => Dialect::Anthropic,
            _ if on("generativelanguage.googleapis.com") => Dialect::GeminiOpenAi,
            _ if on("moonshot.ai") || on("moonshot.cn") || on("kimi.com") => Dialect::Moonshot,
            _ => Dialect::OpenAi,
        }
    }

    fn gemini_schemas(self) -> bool {
        matches!(self, Dialect::Gemini | Dialect::GeminiOpenAi)
    }

    /// Whether `c` may appear in a tool name at position `first` or later.
    fn name_char(self, c: char, first: bool) -> bool {
        let base = c.is_ascii_alphanumeric() || c == '_' || c == '-';
        match self {
            Dialect::Gemini if first => c.is_ascii_alphabetic() || c == '_',
            Dialect::Gemini => base || c == '.' || c == ':',
            Dialect::GeminiOpenAi if first => c.is_ascii_alphabetic() || c == '_',
            _ => base,
        }
    }

    /// Whether `name` is a valid tool name here.
    pub(crate) fn name_is_valid(self, name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_TOOL_NAME
            && name
                .chars()
                .enumerate()
                .all(|(i, c)| self.name_char(c, i == 0))
    }

    /// A valid name for `name`: odd characters become `_`, a bad first character gets a `_`
    /// before it, and an overlong name is cut and keeps a hash of the whole (so two long names
    /// sharing a prefix stay apart).
    pub(crate) fn valid_name(self, name: &str) -> String {
        if self.name_is_valid(name) {
            return name.to_string();
        }
        let mut out: String = name
            .chars()
            .map(|c| if self.name_char(c, false) { c } else { '_' })
            .collect();
        if !out.chars().next().is_some_and(|c| self.name_char(c, true)) {
            out.insert(0, '_');
        }
        if out.len() > MAX_TOOL_NAME {
            let hash = format!("_{:08x}", fnv1a(name.as_bytes()) as u32);
            out.truncate(MAX_TOOL_NAME - hash.len());
            out.push_str(&hash);
        }
        out
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Tool names as sent (`wire`) and as the agent knows them; only renamed tools are stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolNames {
    dialect: Option<Dialect>,
    wire: HashMap<String, String>,
    original: HashMap<String, String>,
}

impl ToolNames {
    /// Valid, distinct wire names for `names` in `dialect`. Valid names stay as they are; the
    /// others are renamed around them.
    pub fn new<'a>(dialect: Dialect, names: impl IntoIterator<Item = &'a str>) -> Self {
        let names: Vec<&str> = names.into_iter().collect();
        let mut used: HashSet<String> = names
            .iter()
            .filter(|n| dialect.name_is_valid(n))
            .map(|n| n.to_string())
            .collect();
        let mut t = ToolNames {
            dialect: Some(dialect),
            ..Default::default()
        };
        for name in names {
            if dialect.name_is_valid(name) || t.wire.contains_key(name) {
                continue;
            }
            let base = dialect.valid_name(name);
            let mut wire = base.clone();
            let mut n = 2;
            while used.contains(&wire) {
                let suffix = format!("_{n}");
                let mut stem = base.clone();
                stem.truncate(MAX_TOOL_NAME - suffix.len());
                wire = format!("{stem}{suffix}");
                n += 1;
            }
            used.insert(wire.clone());
            t.original.insert(wire.clone(), name.to_string());
            t.wire.insert(name.to_string(), wire);
        }
        t
    }

    /// The name to send for `name` (a name not among the tools is made valid the same way).
    pub fn wire(&self, name: &str) -> String {
        match (self.wire.get(name), self.dialect) {
            (Some(w), _) => w.clone(),
            (None, Some(d)) => d.valid_name(name),
            (None, None) => name.to_string(),
        }
    }

    /// The agent's name for a name the model called.
    pub fn original<'a>(&'a self, wire: &'a str) -> &'a str {
        self.original.get(wire).map_or(wire, String::as_str)
    }

    /// Whether nothing was renamed.
    pub(crate) fn is_identity(&self) -> bool {
        self.original.is_empty()
    }
}

/// Rewrite `req`'s tools (names and schemas) and the tool names in its history for `dialect`.
pub(crate) fn prepare_request(dialect: Dialect, req: &mut ProviderRequest) -> ToolNames {
    let names = ToolNames::new(dialect, req.tools.iter().map(|t| t.name.as_str()));
    for t in &mut req.tools {
        t.name = names.wire(&t.name);
        t.parameters = normalise(dialect, &t.parameters);
    }
    for m in &mut req.messages {
        match m {
            Message::Assistant { parts } => {
                for p in parts {
                    if let AssistantPart::ToolCall { name, .. } = p {
                        *name = names.wire(name);
                    }
                }
            }
            Message::ToolResult { name, .. } => *name = names.wire(name),
            Message::User { .. } => {}
        }
    }
    names
}

/// The tool-parameters schema `schema` as `dialect` accepts it. The root is always an object.
pub(crate) fn normalise(dialect: Dialect, schema: &Value) -> Value {
    let empty = Map::new();
    let defs = schema
        .get("$defs")
        .or_else(|| schema.get("definitions"))
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let cx = Cx { dialect, defs };
    let Value::Object(mut o) = cx.node(schema, 0) else {
        return json!({"type": "object", "properties": {}});
    };
    flatten_root(&mut o);
    if o.get("type") != Some(&json!("object")) {
        // A root that is not an object (or has no type) cannot be a parameters object: wrap it
        // unless it already describes properties.
        if !o.contains_key("properties") {
            o.clear();
        }
        o.insert("type".into(), json!("object"));
    }
    o.remove("nullable");
    o.entry("properties").or_insert_with(|| json!({}));
    Value::Object(o)
}

/// Providers want a plain object at the root (OpenAI refuses `anyOf`/`oneOf`/`allOf`/`enum`/`not`
/// there): alternatives contribute their properties (none required), `allOf` is folded in.
fn flatten_root(o: &mut Map<String, Value>) {
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(alts)) = o.remove(key) else {
            continue;
        };
        for alt in alts {
            let Some(Value::Object(props)) = alt.get("properties").cloned() else {
                continue;
            };
            let mine = o.entry("properties").or_insert_with(|| json!({}));
            if let Some(mine) = mine.as_object_mut() {
                for (k, v) in props {
                    mine.entry(k).or_insert(v);
                }
            }
        }
    }
    if let Some(Value::Array(all)) = o.remove("allOf") {
        merge_all_of(o, all);
    }
    for key in ["not", "enum", "const"] {
        o.remove(key);
    }
}

struct Cx<'a> {
    dialect: Dialect,
    defs: &'a Map<String, Value>,
}

/// The fields of Gemini's `Schema` object (its OpenAPI 3 subset), as documented; others are
/// dropped.
pub const GEMINI_KEYWORDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "items",
    "properties",
    "required",
    "anyOf",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "propertyOrdering",
];

/// Keywords dropped everywhere: meta data and definitions (inlined instead).
const META_KEYS: &[&str] = &[
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "$anchor",
    "$dynamicAnchor",
    "$dynamicRef",
];

impl Cx<'_> {
    fn node(&self, v: &Value, depth: usize) -> Value {
        let Some(src) = v.as_object() else {
            return json!({}); // `true`, `false` or junk: unconstrained
        };
        let mut o = src.clone();
        if let Some(target) = self.resolve_ref(&mut o, depth) {
            // Sibling keywords (a description) win over the referenced schema's.
            let mut merged = target;
            merged.extend(o);
            o = merged;
        }
        for k in META_KEYS {
            o.remove(*k);
        }
        let depth = depth + 1;
        let gemini = self.dialect.gemini_schemas();
        if gemini {
            if let Some(Value::Array(all)) = o.remove("allOf") {
                let members = all.iter().map(|m| self.node(m, depth)).collect();
                merge_all_of(&mut o, members);
            }
            gemini_node(&mut o);
        }
        if let Some(props) = o.get_mut("properties").and_then(Value::as_object_mut) {
            for p in props.values_mut() {
                *p = self.node(p, depth);
            }
        }
        if o.get("properties").is_some_and(|p| !p.is_object()) {
            o.remove("properties");
        }
        tuple_items(&mut o);
        if let Some(items) = o.get_mut("items") {
            *items = self.node(items, depth);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(list) = o.get_mut(key).and_then(Value::as_array_mut) {
                for s in list.iter_mut() {
                    *s = self.node(s, depth);
                }
            }
        }
        for key in ["not", "additionalProperties", "contains"] {
            if let Some(s) = o.get_mut(key).filter(|s| s.is_object()) {
                *s = self.node(s, depth);
            }
        }
        infer_type(&mut o);
        if gemini {
            gemini_keywords(&mut o);
        }
        object_rules(&mut o, self.dialect);
        Value::Object(o)
    }

    /// Take `$ref` out of `o` and return the (normalised) schema it names. A reference we cannot
    /// resolve, or one nested too deep (recursion), leaves an unconstrained node.
    fn resolve_ref(&self, o: &mut Map<String, Value>, depth: usize) -> Option<Map<String, Value>> {
        let r = o.remove("$ref")?;
        let name = r.as_str().and_then(|r| {
            r.strip_prefix("#/$defs/")
                .or_else(|| r.strip_prefix("#/definitions/"))
        });
        let target = name
            .and_then(|n| self.defs.get(n))
            .filter(|_| depth < MAX_REF_DEPTH);
        match target {
            Some(t) => match self.node(t, depth + 1) {
                Value::Object(m) => Some(m),
                _ => None,
            },
            None => {
                let note = "Any JSON value.";
                o.entry("description").or_insert_with(|| json!(note));
                None
            }
        }
    }
}

/// Tuple arrays (`items: [..]`, `prefixItems`) become one `items` schema (`anyOf` of the
/// positions) with the length pinned when no extra items are allowed.
fn tuple_items(o: &mut Map<String, Value>) {
    let list = match o.remove("prefixItems") {
        Some(Value::Array(l)) => Some(l),
        _ => match o.get("items") {
            Some(Value::Array(l)) => Some(l.clone()),
            _ => None,
        },
    };
    let Some(list) = list else { return };
    let closed = matches!(
        o.get("items"),
        Some(Value::Bool(false)) | Some(Value::Array(_))
    ) && !matches!(o.get("additionalItems"), Some(v) if v != &json!(false));
    o.remove("additionalItems");
    let n = list.len();
    let mut distinct: Vec<Value> = Vec::new();
    for s in list {
        if !distinct.contains(&s) {
            distinct.push(s);
        }
    }
    let items = match distinct.len() {
        0 => json!({}),
        1 => distinct.pop().unwrap_or_default(),
        _ => json!({"anyOf": distinct}),
    };
    o.insert("items".into(), items);
    if closed && n > 0 {
        o.entry("minItems").or_insert_with(|| json!(n));
        o.entry("maxItems").or_insert_with(|| json!(n));
    }
    o.entry("type").or_insert_with(|| json!("array"));
}

/// A missing `type` that the rest of the node implies.
fn infer_type(o: &mut Map<String, Value>) {
    if o.contains_key("type") || o.contains_key("anyOf") || o.contains_key("oneOf") {
        return;
    }
    let t = if o.contains_key("properties") || o.contains_key("required") {
        "object"
    } else if o.contains_key("items") {
        "array"
    } else if let Some(Value::Array(e)) = o.get("enum") {
        match e.first() {
            Some(Value::String(_)) => "string",
            Some(Value::Bool(_)) => "boolean",
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => "integer",
            Some(Value::Number(_)) => "number",
            _ => return,
        }
    } else {
        return;
    };
    o.insert("type".into(), json!(t));
}

/// Objects carry `properties` (Gemini refuses an empty one), `required` names only properties
/// that exist.
fn object_rules(o: &mut Map<String, Value>, dialect: Dialect) {
    if o.get("type") != Some(&json!("object")) {
        return;
    }
    let props: Vec<String> = o
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    if dialect.gemini_schemas() {
        if props.is_empty() {
            o.remove("properties");
        }
    } else {
        o.entry("properties").or_insert_with(|| json!({}));
    }
    if let Some(req) = o.get("required").and_then(Value::as_array) {
        let kept: Vec<Value> = req
            .iter()
            .filter(|r| r.as_str().is_some_and(|r| props.iter().any(|p| p == r)))
            .cloned()
            .collect();
        if kept.is_empty() {
            o.remove("required");
        } else {
            o.insert("required".into(), Value::Array(kept));
        }
    }
}

/// Rewrite one node's own keywords into Gemini's OpenAPI 3 subset (before its children).
fn gemini_node(o: &mut Map<String, Value>) {
    if let Some(c) = o.remove("const") {
        o.entry("enum").or_insert_with(|| json!([c]));
    }
    if let Some(one) = o.remove("oneOf") {
        o.entry("anyOf").or_insert(one);
    }
    type_list(o);
    null_in_any_of(o);
    enum_rules(o);
}

/// Drop what Gemini does not know: formats other than its own, unknown keywords.
fn gemini_keywords(o: &mut Map<String, Value>) {
    let fmt_ok = match (o.get("type").and_then(Value::as_str), o.get("format")) {
        (_, None) => true,
        (Some("string"), Some(f)) => f == "enum" || f == "date-time",
        (Some("number"), Some(f)) => f == "float" || f == "double",
        (Some("integer"), Some(f)) => f == "int32" || f == "int64",
        _ => false,
    };
    if !fmt_ok {
        o.remove("format");
    }
    o.retain(|k, _| GEMINI_KEYWORDS.contains(&k.as_str()));
}

/// `allOf` members are folded into the node (properties and `required` unioned; other keys
/// fill gaps), which is what it means for the object schemas tools use.
fn merge_all_of(o: &mut Map<String, Value>, all: Vec<Value>) {
    for member in all {
        let Value::Object(m) = member else { continue };
        for (k, v) in m {
            match (k.as_str(), o.get_mut(&k)) {
                ("properties", Some(Value::Object(p))) => {
                    if let Value::Object(extra) = v {
                        for (pk, pv) in extra {
                            p.entry(pk).or_insert(pv);
                        }
                    }
                }
                ("required", Some(Value::Array(r))) => {
                    for x in v.as_array().into_iter().flatten() {
                        if !r.contains(x) {
                            r.push(x.clone());
                        }
                    }
                }
                (_, Some(_)) => {}
                (_, None) => {
                    o.insert(k, v);
                }
            }
        }
    }
}

/// `type: ["string", "null"]` → `type: string, nullable: true`; several types → `anyOf`.
fn type_list(o: &mut Map<String, Value>) {
    let types: Vec<String> = match o.get("type") {
        Some(Value::Array(t)) => t
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(Value::String(t)) if t == "null" => vec![t.clone()],
        _ => return,
    };
    o.remove("type");
    let nullable = types.iter().any(|t| t == "null");
    let rest: Vec<&String> = types.iter().filter(|t| *t != "null").collect();
    match rest.as_slice() {
        [] => {
            o.insert("type".into(), json!("string"));
        }
        [one] => {
            o.insert("type".into(), json!(one));
        }
        many => {
            let list: Vec<Value> = many.iter().map(|t| json!({"type": t})).collect();
            o.insert("anyOf".into(), Value::Array(list));
        }
    }
    if nullable {
        o.insert("nullable".into(), json!(true));
    }
}

/// An `anyOf` member `{type: "null"}` becomes `nullable` on the node; a single remaining member
/// is inlined.
fn null_in_any_of(o: &mut Map<String, Value>) {
    let Some(Value::Array(list)) = o.get_mut("anyOf") else {
        return;
    };
    let is_null = |s: &Value| match s.get("type") {
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(t)) => t.iter().all(|t| t == "null"),
        _ => false,
    };
    let before = list.len();
    list.retain(|s| !is_null(s));
    let had_null = list.len() != before;
    match list.len() {
        0 => {
            o.remove("anyOf");
        }
        1 => {
            let only = list.pop().unwrap_or_default();
            o.remove("anyOf");
            if let Value::Object(m) = only {
                for (k, v) in m {
                    o.entry(k).or_insert(v);
                }
            }
            type_list(o);
        }
        _ => {}
    }
    if had_null {
        o.insert("nullable".into(), json!(true));
    }
}

/// Gemini enums are strings only: others are listed in the description instead.
fn enum_rules(o: &mut Map<String, Value>) {
    infer_type(o); // while the values still say which type they are
    let Some(Value::Array(values)) = o.get("enum") else {
        return;
    };
    let strings = values.iter().all(Value::is_string);
    let typed_string = matches!(o.get("type").and_then(Value::as_str), Some("string") | None);
    if strings && typed_string && !values.is_empty() {
        o.insert("type".into(), json!("string"));
        return;
    }
    let listed: Vec<String> = values.iter().map(Value::to_string).collect();
    o.remove("enum");
    let note = format!("One of: {}.", listed.join(", "));
    let desc = match o.get("description").and_then(Value::as_str) {
        Some(d) if !d.is_empty() => format!("{d} {note}"),
        _ => note,
    };
    o.insert("description".into(), json!(desc));
}

#[cfg(test)]
mod tests;
