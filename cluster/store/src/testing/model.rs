//! Model-based property test: random sequences of operations run against a store and against
//! a plain in-memory map with the same rules; every result must agree.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::Store;
use crate::error::{PreconditionKind, StoreError};
use crate::types::{KeyValue, ListRequest, Op, OpResult};

const KEYS: usize = 4;

/// One generated step.
#[derive(Clone, Debug)]
enum Step {
    Txn(Vec<GenOp>),
    Get(usize),
    List(usize),
}

/// An operation on key number `k`; `stale` makes its precondition name a wrong revision.
#[derive(Clone, Debug)]
enum GenOp {
    Create(usize, u8),
    Update(usize, u8, bool),
    Put(usize, u8),
    Delete(usize, Option<bool>),
    Check(usize, bool),
}

impl GenOp {
    fn key(&self) -> usize {
        match self {
            GenOp::Create(k, _)
            | GenOp::Update(k, _, _)
            | GenOp::Put(k, _)
            | GenOp::Delete(k, _)
            | GenOp::Check(k, _) => *k,
        }
    }
}

fn gen_op() -> impl Strategy<Value = GenOp> {
    let k = 0..KEYS;
    prop_oneof![
        (k.clone(), any::<u8>()).prop_map(|(k, v)| GenOp::Create(k, v)),
        (k.clone(), any::<u8>(), prop::bool::weighted(0.2))
            .prop_map(|(k, v, s)| GenOp::Update(k, v, s)),
        (k.clone(), any::<u8>()).prop_map(|(k, v)| GenOp::Put(k, v)),
        (k.clone(), prop::option::of(prop::bool::weighted(0.2)))
            .prop_map(|(k, s)| GenOp::Delete(k, s)),
        (k, prop::bool::weighted(0.3)).prop_map(|(k, s)| GenOp::Check(k, s)),
    ]
}

fn gen_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec(gen_op(), 1..4).prop_map(|mut ops| {
            let mut seen = [false; KEYS];
            ops.retain(|op| !std::mem::replace(&mut seen[op.key()], true));
            Step::Txn(ops)
        }),
        1 => (0..KEYS).prop_map(Step::Get),
        1 => (0..KEYS + 1).prop_map(Step::List),
    ]
}

struct Model {
    prefix: String,
    kvs: BTreeMap<Bytes, KeyValue>,
    last_revision: i64,
}

impl Model {
    fn key(&self, k: usize) -> Bytes {
        Bytes::from(format!("{}k{k}", self.prefix))
    }

    /// The store op for a generated op, given the model's state.
    fn op(&self, g: &GenOp) -> Op {
        let key = self.key(g.key());
        let cur = self.kvs.get(&key).map_or(0, |kv| kv.mod_revision);
        let wrong = |stale: bool| {
            if stale || cur == 0 {
                cur + 1_000_000
            } else {
                cur
            }
        };
        let value = |v: &u8| Bytes::from(vec![*v]);
        match g {
            GenOp::Create(_, v) => Op::Create {
                key,
                value: value(v),
                lease: 0,
            },
            GenOp::Update(_, v, stale) => Op::Update {
                key,
                value: value(v),
                expected: wrong(*stale),
                lease: 0,
            },
            GenOp::Put(_, v) => Op::Put {
                key,
                value: value(v),
                lease: 0,
            },
            GenOp::Delete(_, s) => Op::Delete {
                key,
                expected: s.map(wrong),
            },
            GenOp::Check(_, stale) => Op::Check {
                key,
                expected: if *stale { cur + 1_000_000 } else { cur },
            },
        }
    }

    /// What the store must answer: the first failing precondition, or success. Written out
    /// here rather than calling `Op::precondition_failure` on purpose: a model that shares the
    /// code under test would agree with its bugs.
    fn expect(&self, ops: &[Op]) -> Result<(), (usize, PreconditionKind)> {
        for (i, op) in ops.iter().enumerate() {
            let cur = self.kvs.get(op.key());
            let kind = match (op, cur) {
                (Op::Create { .. }, Some(_)) => Some(PreconditionKind::AlreadyExists),
                (Op::Update { .. } | Op::Delete { .. }, None) => Some(PreconditionKind::NotFound),
                (Op::Check { expected, .. }, None) if *expected != 0 => {
                    Some(PreconditionKind::NotFound)
                }
                (
                    Op::Update { expected, .. }
                    | Op::Delete {
                        expected: Some(expected),
                        ..
                    }
                    | Op::Check { expected, .. },
                    Some(kv),
                ) if kv.mod_revision != *expected => Some(PreconditionKind::RevisionMismatch {
                    expected: *expected,
                    actual: kv.mod_revision,
                }),
                _ => None,
            };
            if let Some(kind) = kind {
                return Err((i, kind));
            }
        }
        Ok(())
    }
}

async fn run_case(
    store: &dyn Store,
    prefix: String,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let mut model = Model {
        prefix,
        kvs: BTreeMap::new(),
        last_revision: 0,
    };
    for step in steps {
        match step {
            Step::Get(k) => {
                let key = model.key(k);
                let got = store
                    .get(&key)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(got.as_ref(), model.kvs.get(&key));
            }
            Step::List(limit) => {
                let mut req = ListRequest {
                    prefix: Bytes::from(model.prefix.clone()),
                    limit,
                    ..Default::default()
                };
                let mut all = Vec::new();
                loop {
                    let page = store
                        .list(req.clone())
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    if limit > 0 {
                        prop_assert!(page.kvs.len() <= limit);
                    }
                    all.extend(page.kvs);
                    match page.continue_token {
                        Some(t) => req.continue_token = Some(t),
                        None => break,
                    }
                }
                let want: Vec<KeyValue> = model.kvs.values().cloned().collect();
                prop_assert_eq!(all, want);
            }
            Step::Txn(gen_ops) => {
                let ops: Vec<Op> = gen_ops.iter().map(|g| model.op(g)).collect();
                let expected = model.expect(&ops);
                let got = store.txn(ops.clone()).await;
                match (expected, got) {
                    (Err((index, kind)), Err(StoreError::PreconditionFailed(p))) => {
                        prop_assert_eq!(p.index, index);
                        prop_assert_eq!(&p.kind, &kind);
                        prop_assert_eq!(p.current.as_ref(), model.kvs.get(&p.key));
                    }
                    (Ok(()), Ok(resp)) => {
                        let writes = ops.iter().any(|op| !matches!(op, Op::Check { .. }));
                        if writes {
                            prop_assert!(resp.revision > model.last_revision);
                            model.last_revision = resp.revision;
                        }
                        for (op, result) in ops.iter().zip(&resp.results) {
                            let key = op.key().clone();
                            match (op, result) {
                                (Op::Check { .. }, OpResult::Checked) => {}
                                (Op::Delete { .. }, OpResult::Deleted(prev)) => {
                                    prop_assert_eq!(Some(prev), model.kvs.get(&key));
                                    model.kvs.remove(&key);
                                }
                                (_, OpResult::Written(kv)) => {
                                    let old = model.kvs.get(&key);
                                    let want = KeyValue {
                                        key: key.clone(),
                                        value: op.value().cloned().unwrap_or_default(),
                                        create_revision: old
                                            .map_or(resp.revision, |o| o.create_revision),
                                        mod_revision: resp.revision,
                                        version: old.map_or(1, |o| o.version + 1),
                                        lease: 0,
                                    };
                                    prop_assert_eq!(kv, &want);
                                    model.kvs.insert(key, want);
                                }
                                (op, r) => {
                                    return Err(TestCaseError::fail(format!(
                                        "{op:?} answered with {r:?}"
                                    )));
                                }
                            }
                        }
                    }
                    (want, got) => {
                        return Err(TestCaseError::fail(format!(
                            "model says {want:?}, store says {got:?}"
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// Runs `cases` random sequences (with shrinking on failure) against `store`. Each case uses
/// keys of a namespace of its own, so one store serves them all.
pub async fn check(store: Arc<dyn Store>, cases: u32) {
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&prop::collection::vec(gen_step(), 1..30), |steps| {
                let n = CASE.fetch_add(1, Ordering::Relaxed);
                let prefix = format!("/registry/pods/model-{n}/");
                handle.block_on(run_case(&*store, prefix, steps))
            })
            .map_err(|e| e.to_string())
    })
    .await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("store disagrees with the model: {e}"),
        Err(e) => panic!("model test panicked: {e}"),
    }
}
