//! The plane's runtime and the one thread that runs it, attached to the Python
//! interpreter once for its whole life.
//!
//! A native session calls the guard on this thread (see `session::bridge`). Taking the
//! GIL on a thread the interpreter does not know creates a Python thread state, and
//! releasing it destroys that state again (its 16 KiB frame stack mapped and unmapped
//! each time): once per batch, that was most of what a batch cost the kernel. So the
//! thread attaches at its start and runs the runtime detached (GIL released, thread
//! state kept); each call then only takes the GIL.

use std::io;
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

pub struct Driver {
    handle: Handle,
    /// Tells the thread to stop the runtime, giving its tasks this long at most.
    stop: Option<oneshot::Sender<Duration>>,
    thread: Option<JoinHandle<()>>,
}

impl Driver {
    /// A current-thread runtime, running on a new thread named `name`.
    pub fn start(name: &str) -> io::Result<Driver> {
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<Duration>();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            Python::attach(|py| {
                py.detach(|| {
                    let timeout = runtime.block_on(async { stopped.await.unwrap_or(Duration::ZERO) });
                    runtime.shutdown_timeout(timeout);
                });
            });
        })?;
        Ok(Driver { handle, stop: Some(stop), thread: Some(thread) })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Stop the runtime (tasks get `timeout` at most) and wait for its thread. Call it
    /// without the GIL: the thread may be waiting for it.
    pub fn shutdown(mut self, timeout: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(timeout);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Driver {
    /// A plane dropped without `shutdown`: the thread stops its runtime on its own
    /// (not waited for: whoever drops it may hold the GIL the thread needs to end).
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Duration::ZERO);
        }
    }
}
