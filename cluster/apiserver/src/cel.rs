//! CEL, the expression language of Kubernetes' `x-kubernetes-validations` rules,
//! ValidatingAdmissionPolicies and webhook `matchConditions`, on the `cel` crate (the
//! cel-rust interpreter) with the part of Kubernetes' own library that operators use.
//!
//! An expression is compiled once, when the object that holds it is written (a CRD, a
//! policy, a webhook configuration), and evaluated per request against JSON values bound
//! to variables (`self`, `object`, `request` …).
//!
//! Three limits keep one expression from taking the API server down, since the
//! interpreter has no cost meter of its own:
//! - **Size**: at most [`MAX_SOURCE`] bytes and [`MAX_DEPTH`] levels of nesting, checked
//!   when compiling. Parsing runs on a thread of its own with a large stack (the parser
//!   recurses per nesting level), so a hostile expression is refused, never a crash.
//! - **Cost**, before every evaluation: the interpreter visits at most
//!   `size × width^nesting` nodes, where `size` counts the expression's nodes, `nesting`
//!   how deeply its comprehensions (`all`, `exists`, `map`, `filter`) nest, and `width` is
//!   the longest list, map or string in the bound values. Above [`COST_LIMIT`] the
//!   evaluation is refused, as Kubernetes refuses a rule over its runtime budget. The
//!   bound is coarse (a rule that nests loops over small lists inside a large object is
//!   charged for the largest list) but never too low.
//! - **Types** are not checked when compiling (the crate has no type checker): a rule
//!   that compares a string with a number compiles and fails when evaluated, with the
//!   interpreter's message. Undeclared variables are refused when compiling.

use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr};
use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelOptional, CelString,
    CelUInt,
};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::extractors::{Arguments, This};
use cel::objects::{Key, Map, Opaque};
use cel::{Context, Env, ExecutionError, IdedExpr, Value as Cel};
use serde_json::Value;
use tessera_core::quantity::Quantity;

/// The longest expression accepted, in bytes.
pub const MAX_SOURCE: usize = 16 * 1024;

/// The deepest an expression's syntax tree may nest.
pub const MAX_DEPTH: usize = 100;

/// The most nodes an evaluation may visit, by the bound in the module's documentation.
pub const COST_LIMIT: u64 = 10_000_000;

/// The stack the parser runs on.
const PARSER_STACK: usize = 64 << 20;

static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("the strings extension declares no conflicting overload");
    Arc::new(env)
});

thread_local! {
    /// The root scope with Kubernetes' library; evaluations bind their variables in a child
    /// scope of it (a Context is not `Sync`, so one per thread).
    static ROOT: Context<'static, 'static> = root();
}

/// A compiled expression.
pub struct Expression {
    source: Arc<str>,
    /// The compiled tree, `matches` calls rewritten to the cached [`MATCHES`].
    tree: IdedExpr,
    size: u64,
    nesting: u32,
    variables: Vec<String>,
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
}

/// A value bound to a variable for one evaluation.
pub enum Binding<'a> {
    /// A JSON value (`null` is CEL's `null`).
    Json(&'a Value),
    /// An optional value (`oldSelf` with `optionalOldSelf`): `optional.of(v)` or
    /// `optional.none()`.
    Optional(Option<&'a Value>),
    /// A value built by the caller (`variables` of a policy).
    Cel(Cel),
    /// A JSON value converted once for several evaluations.
    Converted(&'a Converted<'a>),
}

/// A JSON value as the interpreter's values, borrowing its strings, with the width it adds
/// to an evaluation's cost bound. Bound by reference: evaluating copies nothing.
#[derive(Debug)]
pub struct Converted<'a> {
    value: Box<dyn Val + 'a>,
    width: u64,
}

impl<'a> Converted<'a> {
    /// Converts `v`.
    pub fn of(v: &'a Value) -> Converted<'a> {
        let mut width = 1;
        let value = val(v, &mut width);
        Converted { value, width }
    }
}

/// `v` as an interpreter value borrowing its strings, noting the longest list, map or
/// string in `width`. Null fields of objects are left out, as Kubernetes presents objects
/// to CEL.
fn val<'a>(v: &'a Value, width: &mut u64) -> Box<dyn Val + 'a> {
    match v {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Box::new(CelInt::from(i))
            } else if let Some(u) = n.as_u64() {
                Box::new(CelUInt::from(u))
            } else {
                Box::new(CelDouble::from(n.as_f64().unwrap_or_default()))
            }
        }
        Value::String(s) => {
            *width = (*width).max(s.len() as u64);
            Box::new(CelString::from(s.as_str()))
        }
        Value::Array(items) => {
            *width = (*width).max(items.len() as u64);
            let list: Vec<Box<dyn Val + 'a>> = items.iter().map(|i| val(i, width)).collect();
            Box::new(CelList::from(list))
        }
        Value::Object(m) => {
            *width = (*width).max(m.len() as u64);
            let map: std::collections::HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = m
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (CelMapKey::from(k.as_str()), val(v, width)))
                .collect();
            Box::new(CelMap::from(map))
        }
    }
}

/// The variables of one evaluation, handed to the interpreter by reference.
struct Variables<'a> {
    bound: Vec<(&'a str, &'a (dyn Val + 'a))>,
}

impl VariableResolver for Variables<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        self.bound
            .iter()
            .find(|(name, _)| *name == variable)
            .map(|(_, v)| CowVal::Borrowed(*v))
    }
}

/// The name `matches` calls are compiled to: the same test with the compiled expression
/// kept per thread (the crate compiles the pattern at every call). A name CEL cannot
/// spell, so no expression calls it but through `matches`.
const MATCHES: &str = "@matches";

/// How many compiled regular expressions a thread keeps, and the longest pattern kept.
const REGEX_CACHE: usize = 64;
const REGEX_CACHED_LEN: usize = 256;

/// The most memory one compiled regular expression may take (patterns can come from the
/// objects written, so this bounds what a writer can make a thread hold).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

thread_local! {
    static REGEXES: std::cell::RefCell<std::collections::HashMap<String, Arc<regex::Regex>>> =
        Default::default();
}

/// `pattern` compiled, from this thread's cache.
fn regex(function: &str, pattern: &str) -> Result<Arc<regex::Regex>, ExecutionError> {
    if let Some(re) = REGEXES.with(|c| c.borrow().get(pattern).cloned()) {
        return Ok(re);
    }
    let re = Arc::new(
        regex::RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| err(function, format!("'{pattern}' not a valid regex: {e}")))?,
    );
    if pattern.len() > REGEX_CACHED_LEN {
        return Ok(re);
    }
    REGEXES.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= REGEX_CACHE {
            c.clear();
        }
        c.insert(pattern.to_owned(), re.clone());
    });
    Ok(re)
}

/// CEL's reserved words: a property of that name is selected as `__{word}__`.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The property name a field selection spells with Kubernetes' escapes, if it has any: a
/// reserved word as `__{word}__`; else `__underscores__` for `__`, `__dot__` for `.`,
/// `__dash__` for `-` and `__slash__` for `/` (`self.x__dash__prop` reads `x-prop`).
fn unescape_property(field: &str) -> Option<String> {
    if let Some(word) = field
        .strip_prefix("__")
        .and_then(|f| f.strip_suffix("__"))
        .filter(|w| RESERVED.contains(w))
    {
        return Some(word.to_owned());
    }
    if !field.contains("__") {
        return None;
    }
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    let mut changed = false;
    while let Some(at) = rest.find("__") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let escape = [
            ("__underscores__", "__"),
            ("__dot__", "."),
            ("__dash__", "-"),
            ("__slash__", "/"),
        ]
        .into_iter()
        .find(|(e, _)| tail.starts_with(e));
        match escape {
            Some((e, plain)) => {
                out.push_str(plain);
                rest = &tail[e.len()..];
                changed = true;
            }
            None => {
                out.push('_');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// Rewrites `tree` for evaluation, without recursion: `matches` calls to [`MATCHES`], and
/// escaped property names in field selections to the names themselves.
fn cache_matches(tree: &mut IdedExpr) {
    let mut stack: Vec<&mut IdedExpr> = vec![tree];
    while let Some(e) = stack.pop() {
        match &mut e.expr {
            Expr::Call(call) => {
                if call.func_name == "matches" {
                    call.func_name = MATCHES.to_owned();
                }
                if let Some(t) = call.target.as_deref_mut() {
                    stack.push(t);
                }
                stack.extend(call.args.iter_mut());
            }
            Expr::Comprehension(c) => {
                let c = &mut **c;
                stack.extend([
                    &mut c.iter_range,
                    &mut c.accu_init,
                    &mut c.loop_cond,
                    &mut c.loop_step,
                    &mut c.result,
                ]);
            }
            Expr::List(l) => stack.extend(l.elements.iter_mut()),
            Expr::Map(m) => {
                for entry in &mut m.entries {
                    if let EntryExpr::MapEntry(me) = &mut entry.expr {
                        stack.push(&mut me.key);
                        stack.push(&mut me.value);
                    }
                }
            }
            Expr::Struct(st) => {
                for entry in &mut st.entries {
                    if let EntryExpr::StructField(f) = &mut entry.expr {
                        stack.push(&mut f.value);
                    }
                }
            }
            Expr::Select(sel) => {
                if let Some(name) = unescape_property(&sel.field) {
                    sel.field = name;
                }
                stack.push(&mut sel.operand);
            }
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

/// Compiles `source`, which may use the variables `declared`.
pub fn compile(source: &str, declared: &[&str]) -> Result<Expression, String> {
    if source.trim().is_empty() {
        return Err("compilation failed: the expression is empty".into());
    }
    if source.len() > MAX_SOURCE {
        return Err(format!(
            "compilation failed: the expression is {} bytes long; at most {MAX_SOURCE} are accepted",
            source.len()
        ));
    }
    let text = source.to_owned();
    let program = std::thread::Builder::new()
        .name("cel-parser".into())
        .stack_size(PARSER_STACK)
        .spawn(move || -> Result<(IdedExpr, Shape), String> {
            let program = ENV
                .compile(&text)
                .map_err(|e| format!("compilation failed: {e}"))?;
            let shape = Shape::of(program.expression());
            if shape.depth > MAX_DEPTH {
                // Dropped here, on the large stack: dropping a deep tree recurses too.
                return Err(format!(
                    "compilation failed: the expression nests {} levels deep; at most {MAX_DEPTH} are accepted",
                    shape.depth
                ));
            }
            let mut tree = program.expression().clone();
            cache_matches(&mut tree);
            Ok((tree, shape))
        })
        .map_err(|e| format!("compilation failed: no thread to parse on: {e}"))?
        .join()
        .map_err(|_| "compilation failed: the parser failed".to_owned())??;
    let (tree, shape) = program;
    if let Some(unknown) = shape
        .variables
        .iter()
        .find(|v| !declared.contains(&v.as_str()))
    {
        return Err(format!(
            "compilation failed: undeclared reference to '{unknown}' (the expression may use {})",
            declared
                .iter()
                .map(|d| format!("'{d}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(Expression {
        source: Arc::from(source),
        tree,
        size: shape.size,
        nesting: shape.nesting,
        variables: shape.variables,
    })
}

/// What a compiled tree looks like: its size, depth, comprehension nesting and free
/// variables, found without recursion.
struct Shape {
    size: u64,
    depth: usize,
    nesting: u32,
    variables: Vec<String>,
}

impl Shape {
    fn of<'a>(root: &'a IdedExpr) -> Shape {
        let mut shape = Shape {
            size: 0,
            depth: 0,
            nesting: 0,
            variables: Vec::new(),
        };
        // (node, depth, comprehension nesting, variables bound by enclosing comprehensions)
        let mut stack: Vec<(&'a IdedExpr, usize, u32, Vec<&'a str>)> =
            vec![(root, 1, 0, Vec::new())];
        while let Some((e, depth, nesting, bound)) = stack.pop() {
            shape.size += 1;
            shape.depth = shape.depth.max(depth);
            shape.nesting = shape.nesting.max(nesting);
            let mut push = |child: &'a IdedExpr, nesting: u32, bound: Vec<&'a str>| {
                stack.push((child, depth + 1, nesting, bound));
            };
            match &e.expr {
                Expr::Ident(name) => {
                    if !bound.contains(&name.as_str()) && !shape.variables.contains(name) {
                        shape.variables.push(name.clone());
                    }
                }
                Expr::Call(call) => {
                    if let Some(t) = &call.target {
                        push(t, nesting, bound.clone());
                    }
                    for a in &call.args {
                        push(a, nesting, bound.clone());
                    }
                }
                Expr::Comprehension(c) => {
                    push(&c.iter_range, nesting, bound.clone());
                    push(&c.accu_init, nesting, bound.clone());
                    let mut inner = bound.clone();
                    inner.push(c.iter_var.as_str());
                    if let Some(v2) = &c.iter_var2 {
                        inner.push(v2.as_str());
                    }
                    inner.push(c.accu_var.as_str());
                    for part in [&c.loop_cond, &c.loop_step] {
                        push(part, nesting + 1, inner.clone());
                    }
                    let mut after = bound.clone();
                    after.push(c.accu_var.as_str());
                    push(&c.result, nesting, after);
                }
                Expr::List(l) => {
                    for x in &l.elements {
                        push(x, nesting, bound.clone());
                    }
                }
                Expr::Map(m) => {
                    for entry in &m.entries {
                        if let EntryExpr::MapEntry(me) = &entry.expr {
                            push(&me.key, nesting, bound.clone());
                            push(&me.value, nesting, bound.clone());
                        }
                    }
                }
                Expr::Struct(s) => {
                    for entry in &s.entries {
                        if let EntryExpr::StructField(f) = &entry.expr {
                            push(&f.value, nesting, bound.clone());
                        }
                    }
                }
                Expr::Select(s) => push(&s.operand, nesting, bound.clone()),
                Expr::Literal(_) | Expr::Unspecified => {}
            }
        }
        shape
    }
}

impl Expression {
    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether it reads the variable `name`.
    pub fn uses(&self, name: &str) -> bool {
        self.variables.iter().any(|v| v == name)
    }

    /// Evaluates it with `bindings`.
    pub fn eval(&self, bindings: &[(&str, Binding<'_>)]) -> Result<Cel, String> {
        let mut width = 1u64;
        // Values converted here (owned) and values converted by the caller (borrowed).
        let mut owned: Vec<(&str, Box<dyn Val + '_>)> = Vec::new();
        let mut borrowed: Vec<(&str, &(dyn Val + '_))> = Vec::new();
        for (name, b) in bindings {
            if !self.uses(name) {
                continue;
            }
            match b {
                Binding::Json(v) => owned.push((name, val(v, &mut width))),
                Binding::Optional(v) => {
                    let inner = v.map(|v| val(v, &mut width));
                    let opt = match inner {
                        Some(i) => CelOptional::of(i),
                        None => CelOptional::none(),
                    };
                    owned.push((name, Box::new(opt)));
                }
                Binding::Cel(v) => {
                    width = width.max(cel_width(v));
                    let boxed = Box::<dyn Val>::try_from(v.clone())
                        .map_err(|e| format!("binding {name}: {e}"))?;
                    owned.push((name, boxed));
                }
                Binding::Converted(c) => {
                    width = width.max(c.width);
                    borrowed.push((name, c.value.as_ref()));
                }
            }
        }
        let cost = (0..self.nesting).fold(self.size, |c, _| c.saturating_mul(width));
        if cost > COST_LIMIT {
            return Err(format!(
                "operation cancelled: actual cost limit exceeded (the expression's {} nodes, comprehensions nested {} deep, over a list, map or string of {} entries may visit {} nodes; the limit is {COST_LIMIT})",
                self.size, self.nesting, width, cost
            ));
        }
        let variables = Variables {
            bound: borrowed
                .into_iter()
                .chain(owned.iter().map(|(n, v)| (*n, v.as_ref())))
                .collect(),
        };
        ROOT.with(|root| {
            let root: &Context<'_, '_> = root;
            let mut scope = root.new_inner_scope();
            scope.set_variable_resolver(&variables);
            // A panic in the interpreter is this request's error, not the server's.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Cel::resolve(&self.tree, &scope)
            }))
            .map_err(|_| "the interpreter failed on this expression".to_owned())?
            .map_err(|e| describe(&e))
        })
    }

    /// Evaluates it to a boolean.
    pub fn eval_bool(&self, bindings: &[(&str, Binding<'_>)]) -> Result<bool, String> {
        match self.eval(bindings)? {
            Cel::Bool(b) => Ok(b),
            other => Err(format!(
                "the expression must evaluate to a bool, not {}",
                type_name(&other)
            )),
        }
    }

    /// Evaluates it to a string.
    pub fn eval_string(&self, bindings: &[(&str, Binding<'_>)]) -> Result<String, String> {
        match self.eval(bindings)? {
            Cel::String(s) => Ok(s.as_str().to_owned()),
            other => Err(format!(
                "the expression must evaluate to a string, not {}",
                type_name(&other)
            )),
        }
    }
}

/// An interpreter error in words (its Debug forms are Rust's).
fn describe(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::UndeclaredReference(r) => format!("undeclared reference to '{r}'"),
        ExecutionError::NoSuchOverload(o) => format!("no matching overload: {o}"),
        other => other.to_string(),
    }
}

/// A CEL type name for messages.
pub fn type_name(v: &Cel) -> &'static str {
    match v {
        Cel::List(_) => "list",
        Cel::Map(_) => "map",
        Cel::Function(..) => "function",
        Cel::Int(_) => "int",
        Cel::UInt(_) => "uint",
        Cel::Float(_) => "double",
        Cel::String(_) => "string",
        Cel::Bytes(_) => "bytes",
        Cel::Bool(_) => "bool",
        Cel::Duration(_) => "google.protobuf.Duration",
        Cel::Timestamp(_) => "google.protobuf.Timestamp",
        Cel::Opaque(_) => "opaque",
        Cel::Struct(_) => "struct",
        Cel::Null => "null_type",
    }
}

/// A JSON value as CEL's, noting the longest list, map or string in `width`.
pub fn json(v: &Value, width: &mut u64) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Cel::Int(i)
            } else if let Some(u) = n.as_u64() {
                Cel::UInt(u)
            } else {
                Cel::Float(n.as_f64().unwrap_or_default())
            }
        }
        Value::String(s) => {
            *width = (*width).max(s.len() as u64);
            Cel::String(Arc::new(s.clone()))
        }
        Value::Array(items) => {
            *width = (*width).max(items.len() as u64);
            Cel::List(Arc::new(items.iter().map(|i| json(i, width)).collect()))
        }
        Value::Object(m) => {
            *width = (*width).max(m.len() as u64);
            // Null fields are absent, as Kubernetes presents objects to CEL.
            let map: std::collections::HashMap<Key, Cel> = m
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), json(v, width)))
                .collect();
            Cel::Map(Map { map: Arc::new(map) })
        }
    }
}

fn cel_width(v: &Cel) -> u64 {
    match v {
        Cel::List(l) => l
            .iter()
            .map(cel_width)
            .max()
            .unwrap_or(0)
            .max(l.len() as u64),
        Cel::Map(m) => m
            .map
            .values()
            .map(cel_width)
            .max()
            .unwrap_or(0)
            .max(m.map.len() as u64),
        Cel::String(s) => s.len() as u64,
        _ => 1,
    }
}

/// A CEL value as JSON (for messages and audit annotations); None for what JSON cannot
/// hold.
pub fn to_json(v: &Cel) -> Option<Value> {
    Some(match v {
        Cel::Null => Value::Null,
        Cel::Bool(b) => Value::Bool(*b),
        Cel::Int(i) => Value::from(*i),
        Cel::UInt(u) => Value::from(*u),
        Cel::Float(f) => serde_json::Number::from_f64(*f).map(Value::Number)?,
        Cel::String(s) => Value::String(s.as_str().to_owned()),
        Cel::List(l) => Value::Array(l.iter().map(to_json).collect::<Option<_>>()?),
        Cel::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m.map.iter() {
                let k = match k {
                    Key::String(s) => s.as_str().to_owned(),
                    Key::Int(i) => i.to_string(),
                    Key::Uint(u) => u.to_string(),
                    Key::Bool(b) => b.to_string(),
                };
                out.insert(k, to_json(v)?);
            }
            Value::Object(out)
        }
        Cel::Opaque(o) => {
            let q = o.downcast_ref::<CelQuantity>()?;
            Value::String(q.0.to_string())
        }
        _ => return None,
    })
}

/// A resource quantity (`quantity('500m')`), Kubernetes' `kubernetes.Quantity` type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CelQuantity(Quantity);

impl Opaque for CelQuantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

fn err(function: &str, why: impl std::fmt::Display) -> ExecutionError {
    ExecutionError::function_error(function, why)
}

fn quantity_of(function: &str, v: &Cel) -> Result<Quantity, ExecutionError> {
    match v {
        Cel::Opaque(o) => o
            .downcast_ref::<CelQuantity>()
            .map(|q| q.0)
            .ok_or_else(|| err(function, "not a quantity")),
        Cel::String(s) => s
            .parse::<Quantity>()
            .map_err(|e| err(function, format!("{s:?} is not a quantity: {e}"))),
        Cel::Int(i) => Ok(Quantity::from_units(*i)),
        other => Err(err(
            function,
            format!("{} is not a quantity", type_name(other)),
        )),
    }
}

fn quantity_value(q: Quantity) -> Cel {
    Cel::Opaque(Arc::new(CelQuantity(q)))
}

fn list_of(function: &str, v: &Cel) -> Result<Arc<Vec<Cel>>, ExecutionError> {
    match v {
        Cel::List(l) => Ok(l.clone()),
        other => Err(err(function, format!("{} is not a list", type_name(other)))),
    }
}

/// Kubernetes' library (the parts operators use): lists (`isSorted`, `sum`, `min`,
/// `max`), regular expressions (`find`, `findAll`), quantities (`quantity`,
/// `isQuantity`, comparisons, arithmetic) and URLs (`isURL`, `url` with its getters).
fn root() -> Context<'static, 'static> {
    let mut c = Context::with_env(ENV.clone());
    let add = |name: &str, r: Result<(), cel::DeclarationError>| {
        r.unwrap_or_else(|e| panic!("CEL library function {name}: {e:?}"));
    };
    add(
        "isSorted",
        c.add_function(
            "isSorted",
            |This(this): This<Cel>| -> Result<bool, ExecutionError> {
                let l = list_of("isSorted", &this)?;
                Ok(l.windows(2).all(|w| w[0] <= w[1]))
            },
        ),
    );
    add(
        "sum",
        c.add_function(
            "sum",
            |This(this): This<Cel>| -> Result<Cel, ExecutionError> {
                let l = list_of("sum", &this)?;
                let mut int = 0i64;
                let mut float = None::<f64>;
                for v in l.iter() {
                    match v {
                        Cel::Int(i) => {
                            int = int
                                .checked_add(*i)
                                .ok_or_else(|| err("sum", "integer overflow"))?
                        }
                        Cel::UInt(u) => {
                            int = int
                                .checked_add(i64::try_from(*u).map_err(|_| err("sum", "overflow"))?)
                                .ok_or_else(|| err("sum", "integer overflow"))?
                        }
                        Cel::Float(f) => *float.get_or_insert(0.0) += f,
                        other => {
                            return Err(err("sum", format!("cannot add {}", type_name(other))));
                        }
                    }
                }
                Ok(match float {
                    Some(f) => Cel::Float(f + int as f64),
                    None => Cel::Int(int),
                })
            },
        ),
    );
    for (name, want) in [
        ("min", std::cmp::Ordering::Less),
        ("max", std::cmp::Ordering::Greater),
    ] {
        let f = move |This(this): This<Cel>| -> Result<Cel, ExecutionError> {
            let l = list_of(name, &this)?;
            let mut best: Option<&Cel> = None;
            for v in l.iter() {
                best = match best {
                    None => Some(v),
                    Some(b) => match v.partial_cmp(b) {
                        Some(o) if o == want => Some(v),
                        Some(_) => Some(b),
                        None => return Err(err(name, "values are not comparable")),
                    },
                };
            }
            best.cloned()
                .ok_or_else(|| err(name, format!("{name} called on an empty list")))
        };
        add(name, c.add_function(name, f));
    }
    add(
        "find",
        c.add_function(
            "find",
            |This(this): This<Arc<String>>, re: Arc<String>| -> Result<Cel, ExecutionError> {
                let re = regex("find", &re)?;
                Ok(Cel::String(Arc::new(
                    re.find(&this)
                        .map(|m| m.as_str().to_owned())
                        .unwrap_or_default(),
                )))
            },
        ),
    );
    add(
        "findAll",
        c.add_function(
            "findAll",
            |This(this): This<Arc<String>>,
             Arguments(args): Arguments|
             -> Result<Cel, ExecutionError> {
                let (re, limit) = match args.as_slice() {
                    [Cel::String(re)] => (re, None),
                    [Cel::String(re), Cel::Int(n)] => (re, usize::try_from(*n).ok()),
                    _ => return Err(err("findAll", "expects (string) or (string, int)")),
                };
                let re = regex("findAll", re)?;
                let found = re
                    .find_iter(&this)
                    .take(limit.unwrap_or(usize::MAX))
                    .map(|m| Cel::String(Arc::new(m.as_str().to_owned())))
                    .collect();
                Ok(Cel::List(Arc::new(found)))
            },
        ),
    );
    add(
        MATCHES,
        c.add_function(
            MATCHES,
            |This(this): This<Arc<String>>, re: Arc<String>| -> Result<bool, ExecutionError> {
                Ok(regex("matches", &re)?.is_match(&this))
            },
        ),
    );
    add(
        "quantity",
        c.add_function(
            "quantity",
            |s: Arc<String>| -> Result<Cel, ExecutionError> {
                Ok(quantity_value(quantity_of("quantity", &Cel::String(s))?))
            },
        ),
    );
    add(
        "isQuantity",
        c.add_function("isQuantity", |s: Arc<String>| s.parse::<Quantity>().is_ok()),
    );
    for (name, which) in [
        ("isGreaterThan", 0u8),
        ("isLessThan", 1),
        ("compareTo", 2),
        ("add", 3),
        ("sub", 4),
    ] {
        let f = move |This(this): This<Cel>, other: Cel| -> Result<Cel, ExecutionError> {
            let a = quantity_of(name, &this)?;
            let b = quantity_of(name, &other)?;
            Ok(match which {
                0 => Cel::Bool(a > b),
                1 => Cel::Bool(a < b),
                2 => Cel::Int(a.cmp(&b) as i64),
                3 => quantity_value(a.saturating_add(b)),
                _ => quantity_value(a.saturating_sub(b)),
            })
        };
        add(name, c.add_function(name, f));
    }
    add(
        "asInteger",
        c.add_function(
            "asInteger",
            |This(this): This<Cel>| -> Result<i64, ExecutionError> {
                let q = quantity_of("asInteger", &this)?;
                if q.milli_ceil() % 1000 != 0 {
                    return Err(err("asInteger", format!("{q} is not an integer")));
                }
                Ok(q.units_ceil())
            },
        ),
    );
    add(
        "isInteger",
        c.add_function(
            "isInteger",
            |This(this): This<Cel>| -> Result<bool, ExecutionError> {
                Ok(quantity_of("isInteger", &this)?.milli_ceil() % 1000 == 0)
            },
        ),
    );
    add(
        "asApproximateFloat",
        c.add_function(
            "asApproximateFloat",
            |This(this): This<Cel>| -> Result<f64, ExecutionError> {
                Ok(quantity_of("asApproximateFloat", &this)?.milli_ceil() as f64 / 1000.0)
            },
        ),
    );
    add(
        "sign",
        c.add_function(
            "sign",
            |This(this): This<Cel>| -> Result<i64, ExecutionError> {
                let q = quantity_of("sign", &this)?;
                Ok(q.cmp(&Quantity::from_units(0)) as i64)
            },
        ),
    );
    add(
        "isURL",
        c.add_function("isURL", |s: Arc<String>| parse_url(&s).is_some()),
    );
    add(
        "url",
        c.add_function("url", |s: Arc<String>| -> Result<Cel, ExecutionError> {
            parse_url(&s).ok_or_else(|| err("url", format!("{s:?} is not a URL")))
        }),
    );
    for (name, key) in [
        ("getScheme", "scheme"),
        ("getHost", "host"),
        ("getHostname", "hostname"),
        ("getPort", "port"),
        ("getEscapedPath", "path"),
        ("getQuery", "query"),
    ] {
        let f = move |This(this): This<Cel>| -> Result<Cel, ExecutionError> {
            match &this {
                Cel::Map(m) => m
                    .map
                    .get(&Key::String(Arc::new(format!("@url.{key}"))))
                    .cloned()
                    .ok_or_else(|| err(name, "not a URL")),
                other => Err(err(name, format!("{} is not a URL", type_name(other)))),
            }
        };
        add(name, c.add_function(name, f));
    }
    c
}

/// A URL as Kubernetes' `url()` reads one (an absolute URI, or an absolute path), as a
/// map of its parts for the getters.
fn parse_url(s: &str) -> Option<Cel> {
    let uri: hyper::Uri = s.parse().ok()?;
    if uri.scheme().is_none() && !s.starts_with('/') {
        return None;
    }
    let str_cel = |v: &str| Cel::String(Arc::new(v.to_owned()));
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let mut query: std::collections::HashMap<Key, Vec<Cel>> = Default::default();
    for pair in uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        query
            .entry(Key::String(Arc::new(k.to_owned())))
            .or_default()
            .push(str_cel(v));
    }
    let query: std::collections::HashMap<Key, Cel> = query
        .into_iter()
        .map(|(k, v)| (k, Cel::List(Arc::new(v))))
        .collect();
    let parts: std::collections::HashMap<Key, Cel> = [
        ("scheme", str_cel(uri.scheme_str().unwrap_or_default())),
        (
            "host",
            str_cel(authority.rsplit('@').next().unwrap_or_default()),
        ),
        (
            "hostname",
            str_cel(uri.host().unwrap_or_default().trim_matches(['[', ']'])),
        ),
        (
            "port",
            str_cel(&uri.port_u16().map(|p| p.to_string()).unwrap_or_default()),
        ),
        ("path", str_cel(uri.path())),
        (
            "query",
            Cel::Map(Map {
                map: Arc::new(query),
            }),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (Key::String(Arc::new(format!("@url.{k}"))), v))
    .collect();
    Some(Cel::Map(Map {
        map: Arc::new(parts),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(src: &str, this: Value) -> Result<Cel, String> {
        compile(src, &["self"])?.eval(&[("self", Binding::Json(&this))])
    }

    #[test]
    fn escaped_property_names_select_the_properties() {
        let obj = json!({"x-prop": 1, "a.b": 2, "c/d": 3, "e__f": 4, "namespace": "ns",
            "in": true, "plain__x": 5, "g__dash__h": 6});
        for (src, want) in [
            ("self.x__dash__prop == 1", true),
            ("self.a__dot__b == 2 && self.c__slash__d == 3", true),
            ("self.e__underscores__f == 4", true),
            ("self.__namespace__ == 'ns' && self.__in__", true),
            ("has(self.x__dash__prop) && !has(self.y__dash__prop)", true),
            // An escape spelled out selects the unescaped name, as in Kubernetes (the
            // property `g__dash__h` is `g__underscores__dash__underscores__h`).
            ("self.g__underscores__dash__underscores__h == 6", true),
            // Not an escape: the name as written.
            ("self.plain__x == 5", true),
        ] {
            assert_eq!(eval(src, obj.clone()), Ok(Cel::Bool(want)), "{src}");
        }
        assert_eq!(unescape_property("plain"), None);
        assert_eq!(unescape_property("__var__").as_deref(), Some("var"));
        assert_eq!(unescape_property("__other__"), None);
        assert_eq!(
            unescape_property("a__dash____dot__b").as_deref(),
            Some("a-.b")
        );
    }

    #[test]
    fn rules_read_json_values() {
        let obj = json!({"min": 1, "max": 3, "names": ["a", "b"], "m": {"k": "v"}});
        for (src, want) in [
            ("self.min <= self.max", true),
            ("self.names.all(n, n.size() == 1)", true),
            ("self.names.exists(n, n == 'c')", false),
            ("has(self.m.k) && !has(self.m.z)", true),
            (
                "self.names.isSorted() && [3, 1].max() == 3 && [2, 5].sum() == 7",
                true,
            ),
            (
                "'abc-12'.find('[0-9]+') == '12' && 'a1b2'.findAll('[0-9]') == ['1', '2']",
                true,
            ),
            ("quantity('1Gi').isGreaterThan(quantity('1000Mi'))", true),
            (
                "quantity('500m').isLessThan(quantity('1')) && quantity('2').asInteger() == 2",
                true,
            ),
            ("isQuantity('1Gi') && !isQuantity('1 Gi')", true),
            (
                "isURL('https://example.com:8443/x?a=1') && !isURL('example')",
                true,
            ),
            (
                "url('https://example.com:8443/x?a=1').getHostname() == 'example.com'",
                true,
            ),
            (
                "url('https://example.com:8443/x?a=1').getPort() == '8443'",
                true,
            ),
            (
                "url('https://e.com/x?a=1&a=2').getQuery()['a'] == ['1', '2']",
                true,
            ),
            (
                "'Hello'.lowerAscii() == 'hello' && 'a,b'.split(',').size() == 2",
                true,
            ),
            ("self.?nothing.orValue(5) == 5", true),
        ] {
            assert_eq!(eval(src, obj.clone()), Ok(Cel::Bool(want)), "{src}");
        }
    }

    #[test]
    fn patterns_from_objects_are_bounded() {
        // A short pattern that compiles to a huge program is refused, not built.
        let e = compile("self.s.matches(self.p)", &["self"]).expect("compiles");
        let obj = json!({"s": "aaa", "p": "a{1000}{1000}"});
        let why = e
            .eval(&[("self", Binding::Json(&obj))])
            .expect_err("refused");
        assert!(why.contains("not a valid regex"), "{why}");
        // Distinct patterns keep working past the cache's size.
        for i in 0..(REGEX_CACHE * 2) {
            let obj = json!({"s": format!("x{i}"), "p": format!("^x{i}$")});
            assert_eq!(
                e.eval(&[("self", Binding::Json(&obj))]),
                Ok(Cel::Bool(true))
            );
        }
        assert!(REGEXES.with(|c| c.borrow().len()) <= REGEX_CACHE);
    }

    #[test]
    fn undeclared_variables_and_bad_syntax_are_refused_when_compiling() {
        let e = compile("self.a > other", &["self"]).expect_err("refused");
        assert!(e.contains("undeclared reference to 'other'"), "{e}");
        // Comprehension variables are declared by their comprehension.
        assert!(compile("self.all(x, self.exists(y, x == y))", &["self"]).is_ok());
        let e = compile("self.a >", &["self"]).expect_err("refused");
        assert!(
            e.starts_with("compilation failed: ERROR: <input>:1:9"),
            "{e}"
        );
        assert!(compile("", &["self"]).is_err());
    }

    #[test]
    fn hostile_expressions_are_refused_not_crashes() {
        for src in [
            format!("{}1{}", "(".repeat(5000), ")".repeat(5000)),
            format!("{}1{}", "[".repeat(5000), "]".repeat(5000)),
            format!("1{}", "+1".repeat(8000)),
            format!("self{}", ".a".repeat(8000)),
            format!("{}1{}", "f(".repeat(4000), ")".repeat(4000)),
            "x".repeat(MAX_SOURCE + 1),
        ] {
            assert!(compile(&src, &["self"]).is_err(), "{}", &src[..20]);
        }
        // Just under the limits still works, and evaluates on a small stack.
        let src = format!("0{}", "+1".repeat(MAX_DEPTH - 5));
        let e = compile(&src, &[]).expect("works");
        let got = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || e.eval(&[]))
            .expect("works")
            .join()
            .expect("works");
        assert_eq!(got, Ok(Cel::Int((MAX_DEPTH - 5) as i64)));
    }

    #[test]
    fn nested_comprehensions_over_large_inputs_are_refused_before_running() {
        let big = Value::Array((0..5000).map(Value::from).collect());
        let flat = compile("self.all(x, x >= 0)", &["self"]).expect("works");
        assert_eq!(
            flat.eval(&[("self", Binding::Json(&big))]),
            Ok(Cel::Bool(true))
        );
        let nested = compile("self.all(x, self.all(y, x + y >= 0))", &["self"]).expect("works");
        let e = nested
            .eval(&[("self", Binding::Json(&big))])
            .expect_err("refused");
        assert!(e.contains("actual cost limit exceeded"), "{e}");
        let small = json!([1, 2, 3]);
        assert_eq!(
            nested.eval(&[("self", Binding::Json(&small))]),
            Ok(Cel::Bool(true))
        );
    }

    /// Arbitrary expressions from CEL's tokens and arbitrary JSON: compiling ends in a
    /// program or an error, and evaluating in a value or an error; never a panic or a
    /// crash.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn token() -> impl Strategy<Value = &'static str> {
            prop::sample::select(vec![
                "self",
                "oldSelf",
                "x",
                ".",
                "a",
                "b",
                "(",
                ")",
                "[",
                "]",
                "{",
                "}",
                ",",
                ":",
                "+",
                "-",
                "*",
                "/",
                "%",
                "==",
                "!=",
                "<",
                "<=",
                ">",
                "&&",
                "||",
                "!",
                "?",
                "in",
                "1",
                "0",
                "-1",
                "9223372036854775807",
                "2.5",
                "'s'",
                "''",
                "true",
                "null",
                "size",
                "has",
                "all",
                "exists",
                "map",
                "filter",
                "matches",
                "startsWith",
                "isSorted",
                "sum",
                "min",
                "max",
                "quantity",
                "url",
                "find",
                "'[a-z'",
                "'1Gi'",
                "int",
                "string",
                "double",
                ".?",
                "orValue",
                " ",
            ])
        }

        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                "[a-z0-9]{0,6}".prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map("[ab]", inner, 0..3)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(
                std::env::var("TESSERA_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
            ))]
            #[test]
            fn expressions_compile_or_fail_and_evaluate_or_fail(
                tokens in prop::collection::vec(token(), 1..24),
                this in json_value(),
                old in json_value(),
            ) {
                let src = tokens.concat();
                if let Ok(e) = compile(&src, &["self", "oldSelf"]) {
                    let _ = e.eval(&[("self", Binding::Json(&this)), ("oldSelf", Binding::Json(&old))]);
                    let _ = e.eval(&[("self", Binding::Json(&this)), ("oldSelf", Binding::Optional(None))]);
                }
            }
        }
    }

    #[test]
    fn optional_bindings_are_cel_optionals() {
        let e = compile(
            "oldSelf.hasValue() ? oldSelf.value() <= self : true",
            &["self", "oldSelf"],
        )
        .expect("works");
        let (new, old) = (json!(5), json!(7));
        let none = e.eval_bool(&[
            ("self", Binding::Json(&new)),
            ("oldSelf", Binding::Optional(None)),
        ]);
        assert_eq!(none, Ok(true));
        let some = e.eval_bool(&[
            ("self", Binding::Json(&new)),
            ("oldSelf", Binding::Optional(Some(&old))),
        ]);
        assert_eq!(some, Ok(false));
    }
}
