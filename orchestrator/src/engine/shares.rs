//! Shares: counts by key, each held to a cap beside a global one, so that one client cannot
//! take all of something the server keeps open: the WebSocket connections of one address
//! (counted at the handshake, before anyone authenticates) and of one agent (counted when a
//! connection authenticates), and one agent's streams ([`crate::engine::streams`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Counts by key, each held to a cap.
#[derive(Debug)]
pub struct Shares<K: Eq + Hash> {
    held: Mutex<HashMap<K, usize>>,
}

impl<K: Eq + Hash> Default for Shares<K> {
    fn default() -> Self {
        Shares {
            held: Mutex::new(HashMap::new()),
        }
    }
}

/// One counted share, given back when dropped.
#[derive(Debug)]
pub struct Share<K: Eq + Hash + Clone> {
    shares: Arc<Shares<K>>,
    key: K,
}

impl<K: Eq + Hash + Clone> Shares<K> {
    /// Counts one more for `key`, unless it holds `cap` already (`None` then).
    pub fn take(self: &Arc<Self>, key: &K, cap: usize) -> Option<Share<K>> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(key.clone()).or_default();
        if *n >= cap {
            if *n == 0 {
                held.remove(key);
            }
            return None;
        }
        *n += 1;
        Some(Share {
            shares: self.clone(),
            key: key.clone(),
        })
    }

    /// How many `key` holds.
    pub fn held_by(&self, key: &K) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key).copied().unwrap_or(0)
    }
}

impl<K: Eq + Hash + Clone> Share<K> {
    /// The key it counts for.
    pub fn key(&self) -> &K {
        &self.key
    }
}

impl<K: Eq + Hash + Clone> Drop for Share<K> {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_held_to_its_cap_and_gets_its_place_back() {
        let s: Arc<Shares<&str>> = Arc::default();
        let a1 = s.take(&"a", 2).unwrap();
        let _a2 = s.take(&"a", 2).unwrap();
        assert!(s.take(&"a", 2).is_none());
        let _b = s.take(&"b", 2).expect("another key has its own count");
        drop(a1);
        assert_eq!(s.held_by(&"a"), 1);
        assert!(s.take(&"a", 2).is_some());
        assert!(s.take(&"z", 0).is_none());
        assert_eq!(s.held_by(&"z"), 0, "a refusal leaves nothing behind");
    }
}
