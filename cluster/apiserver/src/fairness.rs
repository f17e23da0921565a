//! Per-tenant limits on requests in flight: each caller (the admin, each tenant) has its own
//! seats, so one tenant's flood fills only its own and others are still served. A request
//! that finds no free seat is answered at once with 429 and `Retry-After`, as Kubernetes'
//! max-inflight filter does, rather than queued behind the flood.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::User;
use crate::metrics::ApiMetrics;
use crate::status::ApiError;

/// A held seat (or several: a large answer takes more); released when dropped — for an
/// answer, once its body is written or its connection closed.
pub struct Seat {
    permit: OwnedSemaphorePermit,
    sem: Arc<Semaphore>,
    limit: usize,
    who: String,
    gauge: Option<prometheus::IntGauge>,
}

impl Seat {
    /// How many seats it holds.
    pub fn count(&self) -> usize {
        self.permit.num_permits()
    }

    /// Holds `total` seats (at most the caller's limit): an answer of many bytes takes a seat
    /// per [`SEAT_BYTES`] for as long as it is being written, as Kubernetes' priority and
    /// fairness charges a large list more seats. Answers 429 if they are not free now.
    pub fn grow_to(&mut self, total: usize) -> Result<(), ApiError> {
        let total = total.clamp(1, self.limit);
        let have = self.count();
        if total <= have {
            return Ok(());
        }
        match self
            .sem
            .clone()
            .try_acquire_many_owned((total - have) as u32)
        {
            Ok(more) => {
                if let Some(g) = &self.gauge {
                    g.add((total - have) as i64);
                }
                self.permit.merge(more);
                Ok(())
            }
            Err(_) => Err(ApiError::too_many_requests(
                format!(
                    "the answer is too large for the seats {} has free: it needs {total} of {} (one per {} MiB being written); retry after a second, or ask in pages (limit and continue)",
                    self.who,
                    self.limit,
                    SEAT_BYTES >> 20
                ),
                1,
            )),
        }
    }
}

/// Bytes of an answer one seat covers while it is written.
pub const SEAT_BYTES: usize = 1 << 20;

impl Drop for Seat {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.sub(self.count() as i64);
        }
    }
}

/// Each caller's limit and its seats.
type SeatMap = HashMap<String, (usize, Arc<Semaphore>)>;

/// The seats of every caller.
#[derive(Clone)]
pub struct Fairness {
    seats: Arc<Mutex<SeatMap>>,
    metrics: Option<ApiMetrics>,
}

impl Fairness {
    /// No seats taken yet.
    pub fn new(metrics: Option<ApiMetrics>) -> Fairness {
        Fairness {
            seats: Arc::default(),
            metrics,
        }
    }

    /// Takes one of `user`'s `limit` seats, or answers 429.
    pub fn admit(&self, user: &User, limit: usize) -> Result<Seat, ApiError> {
        self.take(user, limit, false)
    }

    /// Takes one of `user`'s `limit` watch slots (a pool apart from its request seats, held
    /// for as long as the watch is open), or answers 429.
    pub fn admit_watch(&self, user: &User, limit: usize) -> Result<Seat, ApiError> {
        self.take(user, limit, true)
    }

    fn take(&self, user: &User, limit: usize, watch: bool) -> Result<Seat, ApiError> {
        let key = if watch {
            format!("{}/watches", user.fairness_key())
        } else {
            user.fairness_key()
        };
        let sem = {
            let mut seats = self.seats.lock();
            let entry = seats
                .entry(key.clone())
                .or_insert_with(|| (limit, Arc::new(Semaphore::new(limit))));
            if entry.0 != limit {
                // The limit changed: new seats; requests on the old ones finish there.
                *entry = (limit, Arc::new(Semaphore::new(limit)));
            }
            entry.1.clone()
        };
        match sem.clone().try_acquire_owned() {
            Ok(permit) => {
                let gauge = self
                    .metrics
                    .as_ref()
                    .filter(|_| !watch)
                    .map(|m| m.inflight(&key));
                if let Some(g) = &gauge {
                    g.inc();
                }
                Ok(Seat {
                    permit,
                    sem,
                    limit,
                    who: user.name(),
                    gauge,
                })
            }
            Err(_) => {
                if let Some(m) = &self.metrics {
                    m.rejected(&key);
                }
                let message = if watch {
                    format!(
                        "too many watches open for {}: the limit is {limit} at once; close some (an admin can raise spec.maxWatches of the Tenant)",
                        user.name()
                    )
                } else {
                    format!(
                        "too many requests in flight for {}: the limit is {limit} at once; retry after a second (an admin can raise spec.maxInflightRequests of the Tenant)",
                        user.name()
                    )
                };
                Err(ApiError::too_many_requests(message, 1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_callers_flood_does_not_take_anothers_seats() {
        let f = Fairness::new(None);
        let a = User::Tenant("a".into());
        let b = User::Tenant("b".into());
        let held: Vec<Seat> = (0..3).map(|_| f.admit(&a, 3).expect("seat")).collect();
        let refused = f.admit(&a, 3).err().expect("a is full");
        assert_eq!(refused.code, 429);
        assert_eq!(refused.retry_after, Some(1));
        assert!(f.admit(&b, 3).is_ok(), "b has its own seats");
        drop(held);
        assert!(f.admit(&a, 3).is_ok(), "seats come back");
        // Watches have slots of their own: they neither take request seats nor go unbounded.
        let watches: Vec<Seat> = (0..2)
            .map(|_| f.admit_watch(&a, 2).expect("slot"))
            .collect();
        let e = f.admit_watch(&a, 2).err().expect("a's watches are full");
        assert!(e.message.contains("too many watches"), "{}", e.message);
        assert!(f.admit(&a, 3).is_ok(), "requests still have seats");
        drop(watches);
        assert!(f.admit_watch(&a, 2).is_ok());
    }

    #[test]
    fn a_large_answer_takes_more_seats_until_it_is_written() {
        let f = Fairness::new(None);
        let a = User::Tenant("a".into());
        let mut big = f.admit(&a, 4).expect("seat");
        big.grow_to(3).expect("three free");
        assert_eq!(big.count(), 3);
        let other = f.admit(&a, 4).expect("the fourth");
        let e = f.admit(&a, 4).err().expect("full");
        assert_eq!(e.code, 429);
        drop(other);
        // More than the limit is capped at it; it fails only if those are taken.
        let held = f.admit(&a, 4).expect("seat");
        let e = big.grow_to(9).expect_err("one is held elsewhere");
        assert!(e.message.contains("needs 4 of 4"), "{}", e.message);
        drop(held);
        big.grow_to(9).expect("all four");
        assert_eq!(big.count(), 4);
        drop(big);
        let back: Vec<Seat> = (0..4).map(|_| f.admit(&a, 4).expect("back")).collect();
        assert_eq!(back.len(), 4);
    }
}
