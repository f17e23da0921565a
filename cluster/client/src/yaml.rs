//! YAML request bodies (`application/yaml`, and `application/apply-patch+yaml` when it is not
//! JSON) turned into the JSON the request path takes, as Kubernetes accepts them.

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, EventReceiver, Parser};
use yaml_rust2::{Yaml, YamlLoader};

/// Notices aliases: the loader would expand them, and nested aliases grow exponentially
/// ("billion laughs"), so bodies with any are refused before loading.
/// It also measures nesting, so that deep documents are refused before anything recursive
/// (loading, converting, dropping) runs over them.
#[derive(Default)]
struct Prescan {
    alias: bool,
    depth: usize,
    deepest: usize,
}

impl EventReceiver for Prescan {
    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Alias(_) => self.alias = true,
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                self.depth += 1;
                self.deepest = self.deepest.max(self.depth);
            }
            Event::SequenceEnd | Event::MappingEnd => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
    }
}

/// Most nesting accepted (a guard against pathological documents).
const MAX_DEPTH: usize = 100;

/// The JSON value of a one-document YAML body.
pub fn to_json(body: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the YAML body is not UTF-8".to_owned())?;
    if let Some(why) = too_deep(text) {
        return Err(why);
    }
    let mut scan = Prescan::default();
    Parser::new_from_str(text)
        .load(&mut scan, true)
        .map_err(|e| format!("invalid YAML: {e}"))?;
    if scan.alias {
        return Err("YAML aliases (*name) are not accepted".into());
    }
    if scan.deepest > MAX_DEPTH {
        return Err(format!("YAML nested deeper than {MAX_DEPTH} levels"));
    }
    let mut docs = YamlLoader::load_from_str(text).map_err(|e| format!("invalid YAML: {e}"))?;
    match docs.len() {
        0 => Err("the YAML body is empty".into()),
        1 => convert(docs.remove(0), 0),
        n => Err(format!(
            "the YAML body has {n} documents; send one object per request"
        )),
    }
}

/// A bound on nesting read from the text alone, before the (recursive) parser sees it: flow
/// brackets, and per line the indentation plus leading `- `/`? ` indicators (each block level
/// needs at least one of either).
fn too_deep(text: &str) -> Option<String> {
    const MAX_BLOCK: usize = 400;
    let (mut flow, mut max_flow) = (0usize, 0usize);
    for line in text.lines() {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let mut rest = line.trim_start();
        let mut dashes = 0;
        while let Some(r) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("? ")) {
            dashes += 1;
            rest = r.trim_start();
        }
        if indent + dashes > MAX_BLOCK {
            return Some(format!(
                "YAML nested deeper than {MAX_BLOCK} levels of indentation"
            ));
        }
        // Brackets are counted everywhere, in quotes and comments too: an overestimate
        // only refuses documents with more than MAX_DEPTH unclosed brackets in strings.
        for c in line.chars() {
            match c {
                '[' | '{' => {
                    flow += 1;
                    max_flow = max_flow.max(flow);
                }
                ']' | '}' => flow = flow.saturating_sub(1),
                _ => {}
            }
        }
        if max_flow > MAX_DEPTH {
            return Some(format!("YAML nested deeper than {MAX_DEPTH} levels"));
        }
    }
    None
}

fn convert(y: Yaml, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("YAML nested deeper than {MAX_DEPTH} levels"));
    }
    Ok(match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Integer(i) => Value::from(i),
        Yaml::Real(r) => r
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| format!("{r} is not a number JSON can hold"))?,
        Yaml::String(s) => Value::String(s),
        Yaml::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|i| convert(i, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Hash(h) => {
            let mut m = Map::new();
            for (k, v) in h {
                let key = match k {
                    Yaml::String(s) => s,
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    Yaml::Real(r) => r,
                    other => return Err(format!("a mapping key must be a string, not {other:?}")),
                };
                m.insert(key, convert(v, depth + 1)?);
            }
            Value::Object(m)
        }
        Yaml::Alias(_) => return Err("YAML aliases are not accepted".into()),
        Yaml::BadValue => return Err("the YAML body holds a value that is not valid".into()),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn manifests_become_json() {
        let y = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels: {app: web}\ndata:\n  n: \"1\"\n  list: [a, b]\nreplicas: 3\nratio: 0.5\non: true\nnothing: null\n";
        assert_eq!(
            to_json(y).expect("valid"),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "labels": {"app": "web"}},
                "data": {"n": "1", "list": ["a", "b"]}, "replicas": 3, "ratio": 0.5, "on": true, "nothing": null})
        );
    }

    #[test]
    fn bad_yaml_is_an_error_with_a_reason() {
        for bad in [
            &b"a: [1, 2"[..],
            b"a: 1\n---\nb: 2\n",
            b"",
            b"\xff\xfe",
            b"a: &x 1\nb: *x\n",
            b"? [1, 2]\n: v\n",
        ] {
            assert!(to_json(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(to_json(deep.as_bytes()).is_err());
    }
}

#[cfg(test)]
mod deep {
    #[test]
    fn very_deep_nesting_is_refused_without_overflowing_the_stack() {
        for open in ["[", "{a: ", "- "] {
            let deep = open.repeat(200_000);
            assert!(super::to_json(deep.as_bytes()).is_err());
        }
    }
}

#[cfg(test)]
mod hidden {
    #[test]
    fn brackets_behind_quotes_or_hashes_still_count() {
        for prefix in ["a: don't ", "a: \"x\" ", "a: b#", "x: '"] {
            let doc = format!("{prefix}{}", "[".repeat(100_000));
            assert!(super::to_json(doc.as_bytes()).is_err(), "{prefix}");
        }
    }
}
