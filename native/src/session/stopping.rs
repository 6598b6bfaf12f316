//! Graceful stop of a plane's native sessions (the sidecar got SIGTERM).
//!
//! Every session registers here for its life. `stop` tells each one (an `Event::Stop`
//! on its queue): it reads no more client frames, lets what is in flight settle, tells
//! its client with an ERROR and ends. A session that registers after `stop` learns it
//! from `enter` at once. `wait` blocks the plane's closing (without the GIL: the
//! sessions still call the guard while they drain) until every session has ended, or
//! a deadline.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::transport::events::Event;

/// What a session tells its client when the plane closes (as the Python plane).
pub const STOP_MESSAGE: &str = "the sidecar is shutting down; reconnect";

#[derive(Default)]
struct State {
    stopping: bool,
    sessions: HashMap<u64, UnboundedSender<Event>>,
}

/// The live sessions of one plane and whether it is stopping.
#[derive(Default)]
pub struct Stopping {
    state: Mutex<State>,
    ended: Condvar,
}

/// A session's registration: dropped when the session ends (however it ends).
pub struct Live {
    owner: Arc<Stopping>,
    id: u64,
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut state = self.owner.lock();
        state.sessions.remove(&self.id);
        if state.sessions.is_empty() {
            self.owner.ended.notify_all();
        }
    }
}

impl Stopping {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register session `id` (told through `sink`); the flag says whether the plane is
    /// stopping already (the session then ends before it serves anything).
    pub fn enter(self: &Arc<Self>, id: u64, sink: UnboundedSender<Event>) -> (Live, bool) {
        let mut state = self.lock();
        let stopping = state.stopping;
        state.sessions.insert(id, sink);
        (Live { owner: self.clone(), id }, stopping)
    }

    pub fn is_stopping(&self) -> bool {
        self.lock().stopping
    }

    /// Tell every live session to drain and end; later ones learn it from `enter`.
    pub fn stop(&self) {
        let mut state = self.lock();
        state.stopping = true;
        for sink in state.sessions.values() {
            let _ = sink.send(Event::Stop);
        }
    }

    pub fn live(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Block until no session is left or `timeout` passed; true if none is left.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while !state.sessions.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self.ended.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::unbounded_channel;

    #[test]
    fn stop_tells_live_sessions_and_later_ones_learn_it_on_entry() {
        let stopping = Arc::new(Stopping::default());
        let (tx, mut rx) = unbounded_channel();
        let (live, stopped) = stopping.enter(1, tx);
        assert!(!stopped && !stopping.is_stopping());
        stopping.stop();
        assert!(matches!(rx.try_recv(), Ok(Event::Stop)));
        let (tx2, mut rx2) = unbounded_channel();
        let (late, stopped) = stopping.enter(2, tx2);
        assert!(stopped, "a session entering after stop must know it");
        assert!(rx2.try_recv().is_err(), "it is told by enter, not by an event");
        assert_eq!(stopping.live(), 2);
        drop(live);
        drop(late);
        assert_eq!(stopping.live(), 0);
    }

    #[test]
    fn wait_returns_when_the_last_session_ends_or_at_the_deadline() {
        let stopping = Arc::new(Stopping::default());
        assert!(stopping.wait(Duration::ZERO), "nothing to wait for");
        let (tx, _rx) = unbounded_channel();
        let (live, _) = stopping.enter(7, tx);
        let started = Instant::now();
        assert!(!stopping.wait(Duration::from_millis(30)));
        assert!(started.elapsed() >= Duration::from_millis(30));
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(live);
        });
        assert!(stopping.wait(Duration::from_secs(10)));
        ender.join().unwrap();
    }
}
