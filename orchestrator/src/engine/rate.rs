//! A request rate per identity: a token bucket per agent id (on each node), refilled at
//! `rate` tokens a second up to `burst`. Every call over WebSocket and every HTTP request of an
//! authenticated agent takes one token; with none left the request is refused with
//! `RateLimited` (-32029) and how long to wait for the next token (`data.retryAfterMs`; HTTP
//! 429 with `Retry-After`), before it does any work. One identity however many connections it
//! holds, so a client cannot buy itself more by opening sockets. A refusal is answered after
//! its [`Refused::hold`], about [`REFUSAL_HOLD`] (spread over ±50%, so that a flood's refusals
//! do not come due together), not at once: a client that does not wait would otherwise make the server
//! refuse as fast as it can send, and the refusals alone would take the cores from everyone
//! else (measured: `benches/fairness.rs`); held, a connection's refusals come no faster than its
//! calls in flight every 100 ms. `retryAfterMs` counts from the answer (at least 1 ms: a refusal
//! whose token comes during its hold says so, not 0). Buckets of identities that stopped
//! sending are dropped (a full bucket is the same as none).
//!
//! The same buckets meter the bytes each identity appends ([`RateLimiter::bytes`]): a budget of
//! bytes a minute, refilled continuously, refused with `QuotaExceeded` (-32032).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proto_spec::{ErrorCode, RpcError};

/// How long a refusal for the rate is held before it is answered.
pub const REFUSAL_HOLD: Duration = Duration::from_millis(100);

/// Shards of the bucket map: calls of different agents rarely wait on one lock.
const SHARDS: usize = 16;
/// A shard forgets its full buckets when it has this many.
const SWEEP_AT: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    /// When `tokens` was right, in microseconds since the limiter's start.
    at: u64,
}

/// A request over its identity's rate: the error to answer, once `hold` has passed.
#[derive(Debug)]
pub struct Refused {
    /// `RateLimited`, with `retryAfterMs` counted from the answer.
    pub error: RpcError,
    /// How long to hold the answer back.
    pub hold: Duration,
}

/// What a limiter meters, and so how it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metered {
    /// Requests: `RateLimited`.
    Requests,
    /// Bytes appended: `QuotaExceeded`.
    AppendBytes,
}

/// The buckets of every identity that sent lately.
#[derive(Debug)]
pub struct RateLimiter {
    /// Tokens a second (0: no limit).
    rate: f64,
    burst: f64,
    metered: Metered,
    shards: Vec<Mutex<HashMap<String, Bucket>>>,
    start: Instant,
}

impl RateLimiter {
    /// `rate` requests a second per identity, in bursts of up to `burst` (at least one); a
    /// rate of 0 limits nothing.
    pub fn new(rate: u32, burst: u32) -> RateLimiter {
        RateLimiter {
            rate: f64::from(rate),
            burst: f64::from(burst.max(1)),
            metered: Metered::Requests,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            start: Instant::now(),
        }
    }

    /// A budget of `per_minute` bytes appended per identity, refilled continuously (a whole
    /// minute's worth may be spent at once); 0 limits nothing.
    pub fn bytes(per_minute: u64) -> RateLimiter {
        RateLimiter {
            rate: per_minute as f64 / 60.0,
            burst: (per_minute as f64).max(1.0),
            metered: Metered::AppendBytes,
            ..RateLimiter::new(0, 1)
        }
    }

    /// Takes a token of `agent`'s bucket, or refuses, saying how long to hold the answer and
    /// how long after it to wait for a token.
    pub fn take(&self, agent: &str) -> Result<(), Refused> {
        self.take_n(agent, 1.0)
    }

    /// Takes `n` tokens (bytes, for a budget of bytes) of `agent`'s bucket, or refuses.
    pub fn take_n(&self, agent: &str, n: f64) -> Result<(), Refused> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let hold = REFUSAL_HOLD.mul_f64(rand::random_range(0.5..1.5));
        self.take_at(agent, n, self.start.elapsed().as_micros() as u64, hold)
    }

    /// [`RateLimiter::take_n`] at `now` (microseconds since the limiter's start), a refusal
    /// held for `hold`.
    fn take_at(&self, agent: &str, n: f64, now: u64, hold: Duration) -> Result<(), Refused> {
        let shard = &self.shards[shard_of(agent)];
        let mut buckets = shard.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= SWEEP_AT {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| refilled(*b, now, rate, burst) < burst);
        }
        let full = Bucket {
            tokens: self.burst,
            at: now,
        };
        let tokens = refilled(
            buckets.get(agent).copied().unwrap_or(full),
            now,
            self.rate,
            self.burst,
        );
        let left = if tokens >= n { tokens - n } else { tokens };
        // The agent's id is copied only for its first bucket, not on every call.
        match buckets.get_mut(agent) {
            Some(b) => {
                *b = Bucket {
                    tokens: left,
                    at: now,
                }
            }
            None => {
                buckets.insert(
                    agent.to_owned(),
                    Bucket {
                        tokens: left,
                        at: now,
                    },
                );
            }
        }
        if tokens >= n {
            return Ok(());
        }
        // Counted from the answer, which comes `hold` after this.
        let wait_ms = (((n - tokens) / self.rate * 1000.0).ceil() as u64)
            .saturating_sub(hold.as_millis() as u64)
            .max(1);
        Err(Refused {
            error: self.refusal(agent, n, wait_ms),
            hold,
        })
    }

    /// The error of a refusal of `n` tokens, the next of which come in `wait_ms`.
    fn refusal(&self, agent: &str, n: f64, wait_ms: u64) -> RpcError {
        match self.metered {
            Metered::Requests => RpcError::new(
                ErrorCode::RateLimited,
                format!(
                    "{agent} is over its request rate ({} a second, bursts of {}); retry in {wait_ms} ms",
                    self.rate, self.burst
                ),
            )
            .with_data(serde_json::json!({
                "retryAfterMs": wait_ms,
                "rate": self.rate,
                "burst": self.burst,
            })),
            Metered::AppendBytes if n > self.burst => RpcError::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "{agent}'s append of {n} bytes is more than its whole budget ({} bytes a minute)",
                    self.burst
                ),
            )
            .with_data(serde_json::json!({"bytesPerMinute": self.burst})),
            Metered::AppendBytes => RpcError::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "{agent} has appended its budget of {} bytes a minute; this append ({n} bytes) fits in {wait_ms} ms",
                    self.burst
                ),
            )
            .with_data(serde_json::json!({
                "retryAfterMs": wait_ms,
                "bytesPerMinute": self.burst,
            })),
        }
    }
}

fn refilled(b: Bucket, now: u64, rate: f64, burst: f64) -> f64 {
    let secs = now.saturating_sub(b.at) as f64 / 1e6;
    (b.tokens + secs * rate).min(burst)
}

fn shard_of(agent: &str) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(agent) as usize % SHARDS
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_millis(70);

    /// When the next token comes, counted from the refusal's decision (the answer says it
    /// from the answer, its hold later).
    fn retry_after(r: &Refused) -> u64 {
        let from_answer = r
            .error
            .data
            .as_ref()
            .and_then(|d| d["retryAfterMs"].as_u64());
        from_answer.unwrap() + r.hold.as_millis() as u64
    }

    #[test]
    fn a_burst_then_the_rate_and_identities_apart() {
        let r = RateLimiter::new(2, 5);
        for _ in 0..5 {
            r.take_at("flood", 1.0, 0, HOLD).unwrap();
        }
        let e = r.take_at("flood", 1.0, 0, HOLD).unwrap_err();
        assert_eq!(e.error.code, ErrorCode::RateLimited);
        assert_eq!(retry_after(&e), 500, "one token every 500 ms");
        assert!(e.error.message.contains("flood"), "{}", e.error.message);
        // Another identity has its own bucket.
        r.take_at("calm", 1.0, 0, HOLD).unwrap();
        // 250 ms later: half a token, still refused, and told to wait the other half.
        let e = r.take_at("flood", 1.0, 250_000, HOLD).unwrap_err();
        assert_eq!(retry_after(&e), 250);
        // A refusal takes nothing: at 500 ms the token is there.
        r.take_at("flood", 1.0, 500_000, HOLD).unwrap();
        assert!(r.take_at("flood", 1.0, 500_000, HOLD).is_err());
        // Idle seconds refill to the burst, no more.
        for _ in 0..5 {
            r.take_at("flood", 1.0, 10_000_000, HOLD).unwrap();
        }
        assert!(r.take_at("flood", 1.0, 10_000_000, HOLD).is_err());
    }

    #[test]
    fn a_budget_of_bytes_refuses_with_its_own_code_and_the_real_wait() {
        let b = RateLimiter::bytes(6_000); // 100 bytes a second
        b.take_at("big", 6_000.0, 0, HOLD).unwrap();
        let e = b.take_at("big", 200.0, 0, HOLD).unwrap_err();
        assert_eq!(e.error.code, ErrorCode::QuotaExceeded);
        assert_eq!(retry_after(&e), 2_000, "200 bytes at 100 a second");
        let whole = b.take_at("big", 7_000.0, 60_000_000, HOLD).unwrap_err();
        assert!(
            whole.error.message.contains("whole budget"),
            "{}",
            whole.error.message
        );
        b.take_at("other", 100.0, 0, HOLD).unwrap();
        // A refusal whose token comes during its hold says 1 ms, not 0.
        let r = RateLimiter::new(1000, 1);
        r.take_at("fast", 1.0, 0, HOLD).unwrap();
        let e = r.take_at("fast", 1.0, 0, HOLD).unwrap_err();
        assert_eq!(e.error.data.as_ref().unwrap()["retryAfterMs"], 1);
    }

    #[test]
    fn no_rate_limits_nothing_and_full_buckets_are_forgotten() {
        let off = RateLimiter::new(0, 0);
        for _ in 0..10_000 {
            off.take("any").unwrap();
        }
        let r = RateLimiter::new(1000, 10);
        let count =
            |r: &RateLimiter| -> usize { r.shards.iter().map(|s| s.lock().unwrap().len()).sum() };
        let n = SWEEP_AT * SHARDS * 2;
        for i in 0..n {
            r.take_at(&format!("agent-{i}"), 1.0, 0, HOLD).unwrap();
        }
        assert_eq!(count(&r), n, "none is full yet: none is forgotten");
        // Ten seconds on, every one of them is full again: the next take in each shard sweeps.
        for i in 0..SHARDS * 64 {
            r.take_at(&format!("later-{i}"), 1.0, 10_000_000, HOLD)
                .unwrap();
        }
        assert_eq!(count(&r), SHARDS * 64);
    }
}
