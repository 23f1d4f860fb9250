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
//! calls in flight every 100 ms. `retryAfterMs` counts from the answer. Buckets of identities
//! that stopped sending are dropped (a full bucket is the same as none).

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

/// The buckets of every identity that sent lately.
#[derive(Debug)]
pub struct RateLimiter {
    /// Tokens a second (0: no limit).
    rate: f64,
    burst: f64,
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
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            start: Instant::now(),
        }
    }

    /// Takes a token of `agent`'s bucket, or refuses, saying how long to hold the answer and
    /// how long after it to wait for a token.
    pub fn take(&self, agent: &str) -> Result<(), Refused> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let hold = REFUSAL_HOLD.mul_f64(rand::random_range(0.5..1.5));
        self.take_at(agent, self.start.elapsed().as_micros() as u64, hold)
    }

    /// [`RateLimiter::take`] at `now` (microseconds since the limiter's start), a refusal held
    /// for `hold`.
    fn take_at(&self, agent: &str, now: u64, hold: Duration) -> Result<(), Refused> {
        let shard = &self.shards[shard_of(agent)];
        let mut buckets = shard.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= SWEEP_AT {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| refilled(*b, now, rate, burst) < burst);
        }
        let b = buckets.entry(agent.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let tokens = refilled(*b, now, self.rate, self.burst);
        if tokens >= 1.0 {
            *b = Bucket {
                tokens: tokens - 1.0,
                at: now,
            };
            return Ok(());
        }
        *b = Bucket { tokens, at: now };
        // Counted from the answer, which comes `hold` after this.
        let wait_ms = (((1.0 - tokens) / self.rate * 1000.0).ceil() as u64)
            .saturating_sub(hold.as_millis() as u64);
        let error = RpcError::new(
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
        }));
        Err(Refused { error, hold })
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
            r.take_at("flood", 0, HOLD).unwrap();
        }
        let e = r.take_at("flood", 0, HOLD).unwrap_err();
        assert_eq!(e.error.code, ErrorCode::RateLimited);
        assert_eq!(retry_after(&e), 500, "one token every 500 ms");
        assert!(e.error.message.contains("flood"), "{}", e.error.message);
        // Another identity has its own bucket.
        r.take_at("calm", 0, HOLD).unwrap();
        // 250 ms later: half a token, still refused, and told to wait the other half.
        let e = r.take_at("flood", 250_000, HOLD).unwrap_err();
        assert_eq!(retry_after(&e), 250);
        // A refusal takes nothing: at 500 ms the token is there.
        r.take_at("flood", 500_000, HOLD).unwrap();
        assert!(r.take_at("flood", 500_000, HOLD).is_err());
        // Idle seconds refill to the burst, no more.
        for _ in 0..5 {
            r.take_at("flood", 10_000_000, HOLD).unwrap();
        }
        assert!(r.take_at("flood", 10_000_000, HOLD).is_err());
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
            r.take_at(&format!("agent-{i}"), 0, HOLD).unwrap();
        }
        assert_eq!(count(&r), n, "none is full yet: none is forgotten");
        // Ten seconds on, every one of them is full again: the next take in each shard sweeps.
        for i in 0..SHARDS * 64 {
            r.take_at(&format!("later-{i}"), 10_000_000, HOLD).unwrap();
        }
        assert_eq!(count(&r), SHARDS * 64);
    }
}
