//! A validator of objects against the published JSON schema of the API
//! (`tests/fixtures/k8s-schema`, strict: no property the API doesn't define).

use serde_json::Value;

/// The API's published JSON schema (strict variant), for the `resource.k8s.io/v1` types.
pub struct Schema {
    defs: Value,
}

impl Schema {
    pub fn load() -> Self {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/k8s-schema/resource.k8s.io-v1.strict.json"
        );
        let text = std::fs::read_to_string(path).expect("the schema fixture");
        let all: Value = serde_json::from_str(&text).expect("the schema fixture is JSON");
        Self {
            defs: all["$defs"].clone(),
        }
    }

    /// What in `value` the schema of `type_name` (e.g. `io.k8s.api.resource.v1.ResourceSlice`)
    /// refuses, each with its JSON path; empty: valid.
    pub fn check(&self, type_name: &str, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        let schema = self.defs[type_name].clone();
        assert!(schema.is_object(), "no schema {type_name}");
        self.walk(&schema, value, "$", &mut errors);
        errors
    }

    fn walk(&self, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let name = r.rsplit('/').next().expect("a $ref names a definition");
            let target = &self.defs[name];
            assert!(target.is_object(), "unresolved {r}");
            self.walk(target, value, at, errors);
        }
        if let Some(one_of) = schema.get("oneOf").and_then(Value::as_array) {
            let matching = one_of
                .iter()
                .filter(|s| {
                    let mut e = Vec::new();
                    self.walk(s, value, at, &mut e);
                    e.is_empty()
                })
                .count();
            if matching != 1 {
                errors.push(format!("{at}: matches {matching} of oneOf"));
            }
        }
        if let Some(types) = schema.get("type") {
            let types: Vec<&str> = match types {
                Value::String(t) => vec![t.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            let ok = types.iter().any(|t| match *t {
                "object" => value.is_object(),
                "array" => value.is_array(),
                "string" => value.is_string(),
                "integer" => value.is_i64() || value.is_u64(),
                "number" => value.is_number(),
                "boolean" => value.is_boolean(),
                "null" => value.is_null(),
                _ => false,
            });
            if !ok {
                errors.push(format!("{at}: {value} is not {types:?}"));
                return;
            }
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array)
            && !value.is_null()
            && !values.contains(value)
        {
            errors.push(format!("{at}: {value} not in {values:?}"));
        }
        if let Some(object) = value.as_object() {
            let properties = schema.get("properties").and_then(Value::as_object);
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !object.contains_key(required) {
                    errors.push(format!("{at}: required {required} missing"));
                }
            }
            for (key, v) in object {
                let path = format!("{at}.{key}");
                match properties.and_then(|p| p.get(key)) {
                    Some(s) => self.walk(s, v, &path, errors),
                    None => match schema.get("additionalProperties") {
                        Some(Value::Bool(false)) => {
                            errors.push(format!("{path}: not a property of the API"));
                        }
                        Some(s) if s.is_object() => self.walk(s, v, &path, errors),
                        _ => {}
                    },
                }
            }
        }
        if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
            for (i, v) in array.iter().enumerate() {
                self.walk(items, v, &format!("{at}[{i}]"), errors);
            }
        }
    }
}
