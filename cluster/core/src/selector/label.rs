//! Label selectors: `app=web,tier!=db,env in (prod,staging),!canary,release`, with
//! Kubernetes' grammar, validation and matching rules.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::names::{label_value, qualified_name};

/// How a requirement compares a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operator {
    /// `key=value` / `key==value`: present with that value.
    Equals,
    /// `key!=value`: absent, or present with another value.
    NotEquals,
    /// `key in (a,b)`: present with one of the values.
    In,
    /// `key notin (a,b)`: absent, or present with none of the values.
    NotIn,
    /// `key`: present.
    Exists,
    /// `!key`: absent.
    DoesNotExist,
    /// `key>n`: present with an integer value greater than n.
    GreaterThan,
    /// `key<n`: present with an integer value less than n.
    LessThan,
}

/// One condition on one label.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// The comparison.
    pub operator: Operator,
    /// Values, sorted and without duplicates.
    pub values: Vec<String>,
}

impl Requirement {
    /// True if `value` (the label's value, or `None` when absent) satisfies this requirement.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let has = |v: &str| self.values.iter().any(|x| x == v);
        let int = |s: &str| s.parse::<i64>().ok();
        match (self.operator, value) {
            (Operator::Equals | Operator::In, Some(v)) => has(v),
            (Operator::Equals | Operator::In, None) => false,
            (Operator::NotEquals | Operator::NotIn, Some(v)) => !has(v),
            (Operator::NotEquals | Operator::NotIn, None) => true,
            (Operator::Exists, v) => v.is_some(),
            (Operator::DoesNotExist, v) => v.is_none(),
            (Operator::GreaterThan, Some(v)) => {
                matches!((int(v), self.values.first().and_then(|x| int(x))), (Some(a), Some(b)) if a > b)
            }
            (Operator::LessThan, Some(v)) => {
                matches!((int(v), self.values.first().and_then(|x| int(x))), (Some(a), Some(b)) if a < b)
            }
            (Operator::GreaterThan | Operator::LessThan, None) => false,
        }
    }
}

/// A label selector: all of its requirements must hold. Empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// Why a string is not a label selector; the message points at what to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct LabelSelectorError(pub String);

impl LabelSelector {
    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    /// A selector of these requirements (sorted by key; each requirement's values sorted and
    /// deduplicated).
    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        for r in &mut requirements {
            r.values.sort();
            r.values.dedup();
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector { requirements }
    }

    /// True if it has no requirements.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True if `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }

    /// True if the labels `get` returns satisfy every requirement.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(get(&r.key)))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    Comma,
    Open,
    Close,
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Gt,
    Lt,
}

/// The punctuation or operator token starting at `b[i]`, with its length.
fn operator(b: &[u8], i: usize) -> Option<(Token, usize)> {
    let next_is_eq = b.get(i + 1) == Some(&b'=');
    Some(match b[i] {
        b',' => (Token::Comma, 1),
        b'(' => (Token::Open, 1),
        b')' => (Token::Close, 1),
        b'=' if next_is_eq => (Token::DoubleEq, 2),
        b'=' => (Token::Eq, 1),
        b'!' if next_is_eq => (Token::NotEq, 2),
        b'!' => (Token::Bang, 1),
        b'>' => (Token::Gt, 1),
        b'<' => (Token::Lt, 1),
        _ => return None,
    })
}

fn lex(s: &str) -> Result<Vec<Token>, LabelSelectorError> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ if let Some((token, len)) = operator(b, i) => {
                out.push(token);
                i += len;
            }
            _ => {
                let start = i;
                while i < b.len() && !b" \t\n\r,()=!<>".contains(&b[i]) {
                    i += 1;
                }
                out.push(Token::Ident(s[start..i].to_owned()));
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }
    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn requirement(&mut self) -> Result<Requirement, LabelSelectorError> {
        let err = |m: String| LabelSelectorError(m);
        if self.peek() == Some(&Token::Bang) {
            self.next();
            let key = match self.next() {
                Some(Token::Ident(k)) => k,
                other => return Err(err(format!("expected a key after '!', found {other:?}"))),
            };
            return make(key, Operator::DoesNotExist, Vec::new());
        }
        let key = match self.next() {
            Some(Token::Ident(k)) => k,
            other => return Err(err(format!("expected a label key, found {other:?}"))),
        };
        let op = match self.peek() {
            None | Some(Token::Comma) => return make(key, Operator::Exists, Vec::new()),
            Some(Token::Eq | Token::DoubleEq) => Operator::Equals,
            Some(Token::NotEq) => Operator::NotEquals,
            Some(Token::Gt) => Operator::GreaterThan,
            Some(Token::Lt) => Operator::LessThan,
            Some(Token::Ident(w)) if w == "in" => Operator::In,
            Some(Token::Ident(w)) if w == "notin" => Operator::NotIn,
            Some(other) => {
                return Err(err(format!(
                    "found {other:?} after key {key:?}, expected one of '=', '==', '!=', 'in', 'notin', '>', '<'"
                )));
            }
        };
        self.next();
        let values = match op {
            Operator::In | Operator::NotIn => {
                if self.next() != Some(Token::Open) {
                    return Err(err(format!("expected '(' after '{key} in/notin'")));
                }
                let mut values = Vec::new();
                loop {
                    match self.next() {
                        Some(Token::Ident(v)) => {
                            values.push(v);
                            match self.next() {
                                Some(Token::Comma) => continue,
                                Some(Token::Close) => break,
                                other => {
                                    return Err(err(format!(
                                        "expected ',' or ')' in the values of {key:?}, found {other:?}"
                                    )));
                                }
                            }
                        }
                        // An empty value: `in (a,)` or `in ()`.
                        Some(Token::Comma) => values.push(String::new()),
                        Some(Token::Close) => {
                            if !values.is_empty() {
                                values.push(String::new());
                            }
                            break;
                        }
                        other => {
                            return Err(err(format!(
                                "unterminated value list of {key:?}, found {other:?}"
                            )));
                        }
                    }
                }
                if values.is_empty() {
                    return Err(err(format!(
                        "{key:?}: for 'in' and 'notin' the set of values must not be empty"
                    )));
                }
                values
            }
            _ => match self.peek() {
                Some(Token::Ident(v)) => {
                    let v = v.clone();
                    self.next();
                    vec![v]
                }
                // `key=` selects the empty value.
                None | Some(Token::Comma) => vec![String::new()],
                Some(other) => {
                    return Err(err(format!(
                        "expected a value for {key:?}, found {other:?}"
                    )));
                }
            },
        };
        make(key, op, values)
    }
}

fn make(
    key: String,
    operator: Operator,
    mut values: Vec<String>,
) -> Result<Requirement, LabelSelectorError> {
    if let Some(why) = qualified_name(&key) {
        return Err(LabelSelectorError(format!(
            "invalid label key {key:?}: {why}"
        )));
    }
    for v in &values {
        if let Some(why) = label_value(v) {
            return Err(LabelSelectorError(format!(
                "invalid label value {v:?} for key {key:?}: {why}"
            )));
        }
    }
    if matches!(operator, Operator::GreaterThan | Operator::LessThan)
        && values.first().is_none_or(|v| v.parse::<i64>().is_err())
    {
        return Err(LabelSelectorError(format!(
            "for '>' and '<' on {key:?} the value must be an integer"
        )));
    }
    values.sort();
    values.dedup();
    Ok(Requirement {
        key,
        operator,
        values,
    })
}

impl FromStr for LabelSelector {
    type Err = LabelSelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut p = Parser {
            tokens: lex(s)?,
            pos: 0,
        };
        let mut requirements = Vec::new();
        while p.peek().is_some() {
            requirements.push(p.requirement()?);
            match p.next() {
                None => break,
                Some(Token::Comma) if p.peek().is_some() => {}
                Some(Token::Comma) => {
                    return Err(LabelSelectorError(
                        "expected a requirement after the last ','".into(),
                    ));
                }
                other => {
                    return Err(LabelSelectorError(format!(
                        "expected ',' between requirements, found {other:?}"
                    )));
                }
            }
        }
        requirements.sort_by(|a, b| (&a.key, a.operator).cmp(&(&b.key, b.operator)));
        Ok(LabelSelector { requirements })
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.values.join(",");
        match self.operator {
            Operator::Equals => write!(f, "{}={v}", self.key),
            Operator::NotEquals => write!(f, "{}!={v}", self.key),
            Operator::In => write!(f, "{} in ({v})", self.key),
            Operator::NotIn => write!(f, "{} notin ({v})", self.key),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::GreaterThan => write!(f, "{}>{v}", self.key),
            Operator::LessThan => write!(f, "{}<{v}", self.key),
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matching_follows_kubernetes() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("rank", "5")]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("rank>4", true),
            ("rank<5", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("  app = web , !canary ", true),
            ("app.kubernetes.io/name=x", false),
        ] {
            let s: LabelSelector = sel.parse().unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        for (sel, needle) in [
            ("app in ()", "must not be empty"),
            ("app in (a", "expected ',' or ')'"),
            ("app in a", "'('"),
            ("=web", "label key"),
            ("app=web,", "after the last ','"),
            ("-bad=x", "invalid label key"),
            ("app=has space", "','"),
            ("app=-x", "invalid label value"),
            ("rank>x", "integer"),
            ("app=web tier=x", "','"),
            ("a b", "found"),
        ] {
            let e = sel.parse::<LabelSelector>().expect_err(sel).to_string();
            assert!(e.contains(needle), "{sel}: {e}");
        }
    }

    proptest! {
        /// The canonical string parses back to the same selector.
        #[test]
        fn display_round_trips(
            reqs in proptest::collection::vec(
                ("[a-z]{1,8}", 0usize..8, proptest::collection::vec("[a-z0-9]{1,6}", 1..3)),
                0..5,
            )
        ) {
            let text = reqs
                .iter()
                .map(|(k, op, vs)| match op {
                    0 => format!("{k}={}", vs[0]),
                    1 => format!("{k}!={}", vs[0]),
                    2 => format!("{k} in ({})", vs.join(",")),
                    3 => format!("{k} notin ({})", vs.join(",")),
                    4 => k.clone(),
                    5 => format!("!{k}"),
                    6 => format!("{k}>{}", vs[0].len()),
                    _ => format!("{k}<{}", vs[0].len()),
                })
                .collect::<Vec<_>>()
                .join(",");
            let parsed: LabelSelector = text.parse().map_err(|e: LabelSelectorError| TestCaseError::fail(format!("{text}: {e}")))?;
            let again: LabelSelector = parsed.to_string().parse().map_err(|e: LabelSelectorError| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(again, parsed);
        }
    }
}
