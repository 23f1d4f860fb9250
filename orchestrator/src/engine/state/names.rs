//! Compact forms of names for the writer's lookups on every append.
//!
//! With thousands of conversations in memory, every pointer followed from a hash table to a
//! string elsewhere on the heap is a cache miss on nearly every append. [`Members`] keeps a
//! conversation's participants as a short sorted array of small numbers (agent names interned
//! process-wide), and [`ShortKey`] keeps a short name inside the hash table's own bucket.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{LazyLock, RwLock};

/// Agent names seen as participants, numbered in order of first sight. Entries are never
/// removed: the set grows with the distinct participant names the process has seen, which the
/// tokens minted and the conversations created bound.
static AGENTS: LazyLock<RwLock<HashMap<Box<str>, u32, ahash::RandomState>>> =
    LazyLock::new(Default::default);

/// The number every name past the first `u32::MAX` shares; a match on it is confirmed by name.
const SHARED: u32 = u32::MAX;

fn lookup(name: &str) -> Option<u32> {
    let agents = AGENTS.read().unwrap_or_else(|p| p.into_inner());
    agents.get(name).copied()
}

fn intern(name: &str) -> u32 {
    if let Some(n) = lookup(name) {
        return n;
    }
    let mut agents = AGENTS.write().unwrap_or_else(|p| p.into_inner());
    let next = u32::try_from(agents.len()).unwrap_or(SHARED);
    *agents.entry(name.into()).or_insert(next)
}

/// Participant lists up to this long (1 KiB of numbers) are scanned rather than searched.
const SCAN_UP_TO: usize = 256;

/// A conversation's participants for the check on every append: their numbers, sorted, in one
/// allocation a few cache lines long (64 participants: 256 bytes).
#[derive(Debug, Clone, Default)]
pub(crate) struct Members(Box<[u32]>);

impl Members {
    pub(crate) fn new(names: &[String]) -> Members {
        let mut nums: Vec<u32> = names.iter().map(|n| intern(n)).collect();
        nums.sort_unstable();
        nums.dedup();
        Members(nums.into())
    }

    /// Whether `name` is one of `names` (the list these members were made from).
    pub(crate) fn contains(&self, name: &str, names: &[String]) -> bool {
        match lookup(name) {
            None => false,
            Some(SHARED) => {
                self.0.binary_search(&SHARED).is_ok() && names.iter().any(|n| n == name)
            }
            // A short list is scanned: its few cache lines are loaded side by side, where a
            // binary search waits for each in turn.
            Some(n) if self.0.len() <= SCAN_UP_TO => self.0.contains(&n),
            Some(n) => self.0.binary_search(&n).is_ok(),
        }
    }
}

/// Bytes a [`ShortKey`] holds in place (conversation ids are short: a UUID is 36).
const INLINE: usize = 38;

/// A name as a hash-table key: up to [`INLINE`] bytes in place, longer ones on the heap. It
/// hashes and compares as the `str` it holds, so a table of them is searched with a `&str`.
#[derive(Debug, Clone)]
pub(crate) enum ShortKey {
    Inline(u8, [u8; INLINE]),
    Heap(Box<str>),
}

impl ShortKey {
    pub(crate) fn new(name: &str) -> ShortKey {
        let b = name.as_bytes();
        if b.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..b.len()].copy_from_slice(b);
            ShortKey::Inline(b.len() as u8, bytes)
        } else {
            ShortKey::Heap(name.into())
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Copied from a `str` whole, so always valid UTF-8.
            ShortKey::Inline(len, bytes) => {
                std::str::from_utf8(&bytes[..*len as usize]).unwrap_or("")
            }
            ShortKey::Heap(s) => s,
        }
    }
}

impl Borrow<str> for ShortKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for ShortKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ShortKey {}

impl Hash for ShortKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_hold_exactly_their_names() {
        let names: Vec<String> = ["alice", "bob", "a-very-long-agent-name-past-thirty-bytes"]
            .map(String::from)
            .to_vec();
        let m = Members::new(&names);
        for n in &names {
            assert!(m.contains(n, &names), "{n}");
        }
        // A name known process-wide (a participant elsewhere) but not here, and one never seen.
        let _ = Members::new(&["carol".to_string()]);
        assert!(!m.contains("carol", &names));
        assert!(!m.contains("never-seen-anywhere", &names));
        assert!(!m.contains("", &names));
    }

    #[test]
    fn long_lists_are_searched_alike() {
        let names: Vec<String> = (0..SCAN_UP_TO * 2).map(|i| format!("agent-{i}")).collect();
        let m = Members::new(&names);
        assert!(names.iter().all(|n| m.contains(n, &names)));
        let _ = Members::new(&["agent-outside".to_string()]);
        assert!(!m.contains("agent-outside", &names));
    }

    #[test]
    fn short_keys_find_their_str() {
        let long = "x".repeat(INLINE + 1);
        let mut map = HashMap::new();
        for (i, k) in ["", "conv-1", &"y".repeat(INLINE), &long]
            .into_iter()
            .enumerate()
        {
            map.insert(ShortKey::new(k), i);
        }
        assert_eq!(map.get("conv-1"), Some(&1));
        assert_eq!(map.get("y".repeat(INLINE).as_str()), Some(&2));
        assert_eq!(map.get(long.as_str()), Some(&3));
        assert_eq!(map.get(""), Some(&0));
        assert_eq!(map.get("conv-2"), None);
        assert!(matches!(ShortKey::new(&long), ShortKey::Heap(_)));
        assert_eq!(ShortKey::new("conv-1").as_str(), "conv-1");
    }
}
