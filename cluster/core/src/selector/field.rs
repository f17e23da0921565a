//! Field selectors: `metadata.name=web,status.phase!=Running`, with Kubernetes' escaping
//! (`\,`, `\=`, `\\` in values). Which fields a resource supports is the API server's concern.

use std::fmt;
use std::str::FromStr;

/// One `field=value` or `field!=value` term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    /// The field path, e.g. `spec.nodeName`.
    pub field: String,
    /// True for `!=`.
    pub negated: bool,
    /// The value (unescaped).
    pub value: String,
}

/// A field selector: every term must hold. Empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

/// Why a string is not a field selector.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid field selector: {0}")]
pub struct FieldSelectorError(pub String);

impl FieldSelector {
    /// The terms.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// True if it has no terms.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// True if every term holds for the fields `get` returns (a missing field reads as "",
    /// as in Kubernetes).
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements
            .iter()
            .all(|r| (get(&r.field).unwrap_or("") == r.value) != r.negated)
    }

    /// The value a selector requires for `field` with `=`, if any (to use an index).
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && !r.negated)
            .map(|r| r.value.as_str())
    }
}

/// Splits on unescaped `sep`, keeping escapes in place.
fn split_unescaped(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(&s[start..i]);
            start = i + 1;
        }
    }
    parts.push(&s[start..]);
    parts
}

fn unescape(s: &str) -> Result<String, FieldSelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=' | '!')) => out.push(e),
                other => {
                    return Err(FieldSelectorError(format!(
                        "invalid escape sequence '\\{}' in {s:?} (only \\\\, \\, \\= and \\! are allowed)",
                        other.map(String::from).unwrap_or_default()
                    )));
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=' | '!') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl FromStr for FieldSelector {
    type Err = FieldSelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { requirements });
        }
        for term in split_unescaped(s, ',') {
            // The first unescaped operator splits field and value.
            let bytes = term.as_bytes();
            let mut i = 0;
            let mut found = None;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' => i += 2,
                    b'!' if bytes.get(i + 1) == Some(&b'=') => {
                        found = Some((i, 2, true));
                        break;
                    }
                    b'=' if bytes.get(i + 1) == Some(&b'=') => {
                        found = Some((i, 2, false));
                        break;
                    }
                    b'=' => {
                        found = Some((i, 1, false));
                        break;
                    }
                    _ => i += 1,
                }
            }
            let Some((at, len, negated)) = found else {
                return Err(FieldSelectorError(format!(
                    "{term:?} has no operator; use field=value, field==value or field!=value"
                )));
            };
            let field = term[..at].trim();
            if field.is_empty() {
                return Err(FieldSelectorError(format!("{term:?} names no field")));
            }
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                negated,
                value: unescape(&term[at + len..])?,
            });
        }
        Ok(FieldSelector { requirements })
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if r.negated { "!=" } else { "=" };
            write!(f, "{}{op}{}", r.field, escape(&r.value))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pod(field: &str) -> Option<&'static str> {
        match field {
            "metadata.name" => Some("web-1"),
            "spec.nodeName" => Some("node-a"),
            "status.phase" => Some("Running"),
            _ => None,
        }
    }

    #[test]
    fn matching_and_escapes() {
        for (sel, want) in [
            ("", true),
            ("metadata.name=web-1", true),
            ("metadata.name==web-1", true),
            ("metadata.name!=web-1", false),
            ("status.phase!=Pending,spec.nodeName=node-a", true),
            ("spec.nodeName=", false),
            ("spec.unknown=", true),
        ] {
            let s: FieldSelector = sel.parse().unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches_with(pod), want, "{sel}");
        }
        let s: FieldSelector = r"metadata.name=a\,b\=c".parse().expect("escaped");
        assert_eq!(s.requirements()[0].value, "a,b=c");
        assert_eq!(s.required_value("metadata.name"), Some("a,b=c"));
        for bad in ["name", "=x", r"a=b\q", "a=b,"] {
            assert!(bad.parse::<FieldSelector>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn display_round_trips(
            terms in proptest::collection::vec(("[a-z]{1,6}(\\.[a-z]{1,6})?", any::<bool>(), "[a-z,=!\\\\ ]{0,8}"), 1..4)
        ) {
            let sel = FieldSelector {
                requirements: terms
                    .into_iter()
                    .map(|(field, negated, value)| FieldRequirement { field, negated, value })
                    .collect(),
            };
            let again: FieldSelector = sel.to_string().parse().map_err(|e: FieldSelectorError| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(again, sel);
        }
    }
}
