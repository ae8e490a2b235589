//! The generators the server answers with: `--max-batch` slots, each a generator with caches of
//! its own, so that as many requests run at once (their forwards batched: `engine::model::Batcher`).
//! A request waits for a free slot (at most `--max-waiting` wait; more are refused with 503).
//!
//! Prefix reuse stays within a tenant: a slot remembers whose text its caches hold (the API key
//! a request came with, else the client's address, or one tenant for all with
//! `--shared-prefix-cache`), a request takes a free slot of its tenant whose cached text shares
//! the longest prefix with its prompt, and a slot handed to another tenant forgets its text
//! first: no client learns from the time or the statistics of its answer what another's prompt
//! began with.

use engine::decode::Generator;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A generator and whose text its caches hold.
pub(super) struct Slot {
    pub(super) generator: Generator<'static>,
    tenant: Option<String>,
    /// Requests it answered (the least used free slot goes to a new tenant).
    last_used: u64,
}

pub(super) struct Pool {
    slots: Mutex<Vec<Option<Slot>>>,
    free: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
    clock: AtomicUsize,
}

/// A slot lent to one request; back in the pool when dropped.
pub(super) struct Lease {
    pool: Arc<Pool>,
    index: usize,
    pub(super) slot: Option<Slot>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let slot = self.slot.take();
        self.pool.slots.lock().unwrap_or_else(|e| e.into_inner())[self.index] = slot;
    }
}

impl Lease {
    pub(super) fn generator(&mut self) -> &mut Generator<'static> {
        &mut self.slot.as_mut().expect("a lease holds its slot").generator
    }
}

/// One request counted as waiting, until dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a request did not get a slot.
pub(super) enum Refused {
    /// `--max-waiting` requests wait already: the number waiting.
    QueueFull(usize),
}

impl Pool {
    pub(super) fn new(generators: Vec<Generator<'static>>, max_waiting: usize) -> Arc<Self> {
        let n = generators.len();
        let slots = generators.into_iter().map(|g| Some(Slot { generator: g, tenant: None, last_used: 0 })).collect();
        Arc::new(Self {
            slots: Mutex::new(slots),
            free: Arc::new(Semaphore::new(n)),
            waiting: AtomicUsize::new(0),
            max_waiting,
            clock: AtomicUsize::new(0),
        })
    }

    /// Requests answered now and waiting for a slot.
    pub(super) fn counts(&self) -> (usize, usize) {
        let running = self.slots.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|s| s.is_none()).count();
        (running, self.waiting.load(Ordering::SeqCst))
    }

    /// Waits for a free slot for `tenant`'s `prompt` (see the module docs), unless
    /// `--max-waiting` requests wait already.
    pub(super) async fn acquire(self: &Arc<Self>, tenant: &str, prompt: &[u32]) -> Result<Lease, Refused> {
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst);
        // Counted from here until a slot is taken, refused, or the request is dropped while it
        // waits (its client hung up): a count left behind by a dropped request kept `/health`
        // saying "waiting" and brought the queue nearer to `--max-waiting` for good.
        let counted = Counted(&self.waiting);
        // A request arriving while the slots are all in use waits, up to the limit.
        if waiting >= self.max_waiting && self.free.available_permits() == 0 {
            return Err(Refused::QueueFull(waiting));
        }
        let permit = Arc::clone(&self.free).acquire_owned().await.expect("the pool's semaphore is never closed");
        drop(counted);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let shared = |s: &Slot| s.generator.cached_text().iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let best = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
            .max_by_key(|(_, s)| {
                let mine = s.tenant.as_deref() == Some(tenant);
                // The tenant's own slot sharing most, else any slot, the least recently used first.
                (mine, if mine { shared(s) } else { 0 }, std::cmp::Reverse(s.last_used))
            })
            .map(|(i, _)| i)
            .expect("a permit means a free slot");
        let mut slot = slots[best].take().expect("a free slot");
        drop(slots);
        if slot.tenant.as_deref() != Some(tenant) {
            slot.generator.forget_cached_text();
            slot.tenant = Some(tenant.to_string());
        }
        slot.last_used = self.clock.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        Ok(Lease { pool: Arc::clone(self), index: best, slot: Some(slot), _permit: permit })
    }
}
