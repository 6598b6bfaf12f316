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
//!
//! "Not for long" needs the runtime to read that CONNECT before it accepts so many
//! newcomers that the real client is the oldest again: tokio accepts tens of thousands
//! of connections a second, faster than a session gets to its first read. So no pending
//! handshake is evicted before it has waited `GRACE`; while the oldest is younger, the
//! accept loop waits (the newcomer stays in the listen backlog). That bounds evictions
//! to `max_pending` per `GRACE` and gives every client at least `GRACE` for its CONNECT
//! however hard the flood.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time a pending handshake is given before it can be evicted.
pub const GRACE: Duration = Duration::from_millis(50);

/// The sessions of one listener: live ones, and those still waiting for their CONNECT
/// (oldest first), each with `T`, the way to tell it it was evicted.
pub struct Book<T> {
    live: HashSet<u64>,
    pending: VecDeque<(u64, T, Instant)>,
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
    pub fn admit(
        &mut self,
        id: u64,
        evict: T,
        max_sessions: usize,
        max_pending: usize,
        now: Instant,
    ) -> Admit<T> {
        if self.live.len() >= max_sessions {
            return Admit::Refused;
        }
        let evicted = if self.pending.len() >= max_pending.max(1) {
            self.pending.pop_front().map(|(_, evict, _)| evict)
        } else {
            None
        };
        self.live.insert(id);
        self.pending.push_back((id, evict, now));
        Admit::Admitted(evicted)
    }

    /// When a newcomer may be admitted without evicting a handshake younger than
    /// `grace`: None if now (room, or the oldest has had its grace, or max-connections
    /// refuses the newcomer anyway).
    pub fn room_at(&self, max_sessions: usize, max_pending: usize, grace: Duration) -> Option<Instant> {
        if self.live.len() >= max_sessions || self.pending.len() < max_pending.max(1) {
            return None;
        }
        let (_, _, since) = self.pending.front()?;
        let at = *since + grace;
        (at > Instant::now()).then_some(at)
    }

    /// Session `id` has its first frame (or ended its handshake): no longer evictable.
    pub fn handshake_over(&mut self, id: u64) {
        if let Some(at) = self.pending.iter().position(|(pending, _, _)| *pending == id) {
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
        self.book().admit(id, evict, self.max_sessions, self.max_pending, Instant::now())
    }

    /// Wait until a newcomer can be admitted without evicting a pending handshake
    /// younger than `GRACE` (see the module doc).
    pub async fn room(&self) {
        loop {
            let at = self.book().room_at(self.max_sessions, self.max_pending, GRACE);
            match at {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => return,
            }
        }
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
        let now = Instant::now();
        assert_eq!(book.admit(1, "a", 2, 10, now), Admit::Admitted(None));
        assert_eq!(book.admit(2, "b", 2, 10, now), Admit::Admitted(None));
        assert_eq!(book.admit(3, "c", 2, 10, now), Admit::Refused);
        book.ended(1);
        book.ended(1);
        assert_eq!(book.sessions(), 1);
        assert_eq!(book.admit(4, "d", 2, 10, now), Admit::Admitted(None));
    }

    #[test]
    fn the_oldest_pending_handshake_makes_room() {
        let mut book = Book::default();
        let now = Instant::now();
        assert_eq!(book.admit(1, "a", 10, 2, now), Admit::Admitted(None));
        assert_eq!(book.admit(2, "b", 10, 2, now), Admit::Admitted(None));
        assert_eq!(book.admit(3, "c", 10, 2, now), Admit::Admitted(Some("a")));
        // Evicted, but live until its session has ended.
        assert_eq!(book.sessions(), 3);
        book.handshake_over(2);
        assert_eq!(book.pending(), 1);
        assert_eq!(book.admit(4, "d", 10, 2, now), Admit::Admitted(None));
        assert_eq!(book.admit(5, "e", 10, 2, now), Admit::Admitted(Some("c")));
        book.ended(4);
        assert_eq!(book.pending(), 1);
        assert_eq!(book.sessions(), 4);
    }

    #[test]
    fn no_handshake_is_evicted_before_its_grace() {
        let mut book = Book::default();
        let long_ago = Instant::now() - Duration::from_secs(1);
        let grace = Duration::from_millis(50);
        assert_eq!(book.admit(1, "a", 10, 2, long_ago), Admit::Admitted(None));
        // Room left: no wait.
        assert_eq!(book.room_at(10, 2, grace), None);
        assert_eq!(book.admit(2, "b", 10, 2, Instant::now()), Admit::Admitted(None));
        // Full, but the oldest has had its grace: evicting it now is fair.
        assert_eq!(book.room_at(10, 2, grace), None);
        assert_eq!(book.admit(3, "c", 10, 2, Instant::now()), Admit::Admitted(Some("a")));
        // Full and the oldest ("b") is younger than the grace: wait until it is not.
        let at = book.room_at(10, 2, grace).expect("a wait");
        assert!(at > Instant::now() && at <= Instant::now() + grace);
        // Its CONNECT came: room without evicting anyone.
        book.handshake_over(2);
        assert_eq!(book.room_at(10, 2, grace), None);
        // At max-connections the newcomer is refused anyway: no wait for it.
        assert_eq!(book.room_at(3, 2, grace), None);
    }
}
