//! One leg's outgoing queue, drained by a writer task that joins what is queued into
//! one write.

use super::*;

/// One side's outgoing queue, drained by a writer task.
pub(super) struct Out {
    tx: Option<mpsc::UnboundedSender<Vec<u8>>>,
    queued: Arc<AtomicUsize>,
    version: Version,
}

impl Out {
    pub(super) fn new(half: Writer, version: Version) -> (Out, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(writer(half, rx, queued.clone()));
        (
            Out {
                tx: Some(tx),
                queued,
                version,
            },
            task,
        )
    }

    fn raw(&self, data: Vec<u8>) {
        if let Some(tx) = &self.tx {
            self.queued.fetch_add(data.len(), Ordering::Relaxed);
            let _ = tx.send(data);
        }
    }

    /// Queue `packet`; false when it cannot be encoded (nothing queued).
    pub(super) fn packet(&self, packet: &Packet) -> bool {
        let mut data = Vec::new();
        if encode(packet, self.version, &mut data).is_err() {
            return false;
        }
        self.raw(data);
        true
    }

    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

async fn writer(
    mut half: Writer,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    queued: Arc<AtomicUsize>,
) {
    while let Some(mut data) = rx.recv().await {
        while data.len() < COALESCE {
            match rx.try_recv() {
                Ok(more) => data.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if half.write_all(&data).await.is_err() {
            break;
        }
        queued.fetch_sub(data.len(), Ordering::Relaxed);
    }
    let _ = half.shutdown().await;
}
