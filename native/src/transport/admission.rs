//! Which clients a listener serving native sessions admits, and which pending
//! handshake makes room for a newer one (as `Sidecar._accept` does on the asyncio plane).
//!
//! At most `max_sessions` sessions at once (max-connections, or fewer when the limit on
//! open files allows fewer): a client over it is refused with an ERROR frame. At most
//! `max_pending` of them may still wait for their CONNECT; when a new client comes and
//! that many wait, the oldest is evicted, not the newcomer: under a flood of idle
//! connections the budget is always full, and refusing newcomers would refuse every
//! real client too, while a real client sends its CONNECT at once and so is never the
//! oldest for long.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// The sessions of one listener: live ones, and those still waiting for their CONNECT
/// (oldest first), each with `T`, the way to tell it it was evicted.
pub struct Book<T> {
    live: HashSet<u64>,
    pending: VecDeque<(u64, T)>,
}

impl<T> Default for Book<T> {
    fn default() -> Self {
        Book { live: HashSet::new(), pending: VecDeque::new() }
    }
}

/// What became of a client.
#[derive(Debug, PartialEq)]
pub enum Admit<T> {
    /// Over max-connections: refused.
    Refused,
    /// Admitted; the evicted oldest pending handshake, if room had to be made.
    Admitted(Option<T>),
}

impl<T> Book<T> {
    pub fn admit(&mut self, id: u64, evict: T, max_sessions: usize, max_pending: usize) -> Admit<T> {
        if self.live.len() >= max_sessions {
            return Admit::Refused;
        }
        let evicted = if self.pending.len() >= max_pending.max(1) {
            self.pending.pop_front().map(|(_, evict)| evict)
        } else {
            None
        };
        self.live.insert(id);
        self.pending.push_back((id, evict));
        Admit::Admitted(evicted)
    }

    /// Session `id` has its first frame (or ended its handshake): no longer evictable.
    pub fn handshake_over(&mut self, id: u64) {
        if let Some(at) = self.pending.iter().position(|(pending, _)| *pending == id) {
            self.pending.remove(at);
        }
    }

    /// Session `id` ended (idempotent).
    pub fn ended(&mut self, id: u64) {
        self.handshake_over(id);
        self.live.remove(&id);
    }

    #[cfg(test)]
    pub fn sessions(&self) -> usize {
        self.live.len()
    }

    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// A listener's `Book` behind a lock, with its limits.
pub struct Admission<T> {
    pub max_sessions: usize,
    pub max_pending: usize,
    book: Mutex<Book<T>>,
}

impl<T> Admission<T> {
    pub fn new(max_sessions: usize, max_pending: usize) -> Self {
        Admission { max_sessions, max_pending, book: Mutex::new(Book::default()) }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book<T>> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn admit(&self, id: u64, evict: T) -> Admit<T> {
        self.book().admit(id, evict, self.max_sessions, self.max_pending)
    }

    pub fn handshake_over(&self, id: u64) {
        self.book().handshake_over(id);
    }

    pub fn ended(&self, id: u64) {
        self.book().ended(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_max_sessions_a_client_is_refused() {
        let mut book = Book::default();
        assert_eq!(book.admit(1, "a", 2, 10), Admit::Admitted(None));
        assert_eq!(book.admit(2, "b", 2, 10), Admit::Admitted(None));
        assert_eq!(book.admit(3, "c", 2, 10), Admit::Refused);
        book.ended(1);
        book.ended(1);
        assert_eq!(book.sessions(), 1);
        assert_eq!(book.admit(4, "d", 2, 10), Admit::Admitted(None));
    }

    #[test]
    fn the_oldest_pending_handshake_makes_room() {
        let mut book = Book::default();
        assert_eq!(book.admit(1, "a", 10, 2), Admit::Admitted(None));
        assert_eq!(book.admit(2, "b", 10, 2), Admit::Admitted(None));
        assert_eq!(book.admit(3, "c", 10, 2), Admit::Admitted(Some("a")));
        // Evicted, but live until its session has ended.
        assert_eq!(book.sessions(), 3);
        book.handshake_over(2);
        assert_eq!(book.pending(), 1);
        assert_eq!(book.admit(4, "d", 10, 2), Admit::Admitted(None));
        assert_eq!(book.admit(5, "e", 10, 2), Admit::Admitted(Some("c")));
        book.ended(4);
        assert_eq!(book.pending(), 1);
        assert_eq!(book.sessions(), 4);
    }
}
