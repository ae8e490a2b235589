//! Forwards of several generations gathered into one ([`Batcher`]): each generation runs on a
//! thread of its own, single-sequence code unchanged, and joins the batcher
//! ([`Batcher::join`]); while it is a member, every [`DecoderModel::forward`] and
//! [`DecoderModel::logits`] it calls is queued, and once every member is waiting in one, the
//! last to arrive runs them all: the forwards of each model as one
//! [`DecoderModel::forward_batch`] (every row's products at once, attention per sequence),
//! the logits of each model as one product. The others sleep meanwhile and get their own rows.
//!
//! So N concurrent generations advance in lockstep, one batched forward per phase of their
//! steps (draft levels, the target's tree, a chunk of a new prompt), at about the price of one:
//! on the CPU a forward of a few rows costs little more than one row. With the CPU kernels a
//! row's result does not depend on the rows beside it, so each generation emits exactly what
//! it would alone.
//!
//! A member must not block on anything but the batcher for long while it generates (a
//! callback that waits for a slow reader would hold every other generation up).

use super::{BatchItem, DecoderModel, KvCache};
use candle_core::{Result, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

thread_local! {
    /// The batcher this thread is a member of ([`Batcher::join`]).
    static MEMBER_OF: RefCell<Option<Arc<Batcher>>> = const { RefCell::new(None) };
}

/// Gathers the forwards of its members (see the module docs).
#[derive(Default)]
pub struct Batcher {
    state: Mutex<State>,
    changed: Condvar,
}

/// What one member asked for: a forward of a sequence, or logits of hidden states.
pub(crate) enum Work {
    Forward { tokens: Vec<u32>, positions: Vec<u32>, bias: Tensor, cache: *mut KvCache },
    Logits { hidden: Tensor },
}

struct Request {
    id: u64,
    model: *const DecoderModel,
    work: Work,
}

// SAFETY: the pointers are to a model and a cache owned by a member thread that waits, without
// touching them, until its request is answered; only the thread running the batch uses them
// meanwhile.
unsafe impl Send for Request {}

#[derive(Default)]
struct State {
    /// Members (threads between `join` and the end of their membership).
    members: usize,
    waiting: Vec<Request>,
    answers: HashMap<u64, Result<Tensor>>,
    next_id: u64,
    /// A member is running a batch.
    running: bool,
    stats: BatchStats,
}

/// Counters of the batches run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batched forwards and logits products run.
    pub batches: u64,
    /// Requests answered by them.
    pub requests: u64,
    /// Rows run by the forwards.
    pub rows: u64,
    /// The most sequences one batched forward held.
    pub widest: u64,
}

/// Membership of a thread in a [`Batcher`]; ends when dropped.
pub struct Membership {
    batcher: Arc<Batcher>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        MEMBER_OF.with(|m| *m.borrow_mut() = None);
        let mut st = self.batcher.lock();
        st.members -= 1;
        // The others may all be waiting now: run their batch.
        let st = self.batcher.lead_if_ready(st);
        drop(st);
        self.batcher.changed.notify_all();
    }
}

impl Batcher {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Makes the calling thread a member until the returned guard is dropped: its models'
    /// forwards and logits go through this batcher.
    pub fn join(self: &Arc<Self>) -> Membership {
        MEMBER_OF.with(|m| *m.borrow_mut() = Some(Arc::clone(self)));
        self.lock().members += 1;
        Membership { batcher: Arc::clone(self) }
    }

    /// Counters of the batches run so far.
    pub fn stats(&self) -> BatchStats {
        self.lock().stats
    }

    /// The batcher the calling thread is a member of.
    pub(crate) fn current() -> Option<Arc<Batcher>> {
        MEMBER_OF.with(|m| m.borrow().clone())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work` on `model` and waits for its answer (running the batch when this member
    /// is the last to wait).
    pub(crate) fn submit(&self, model: &DecoderModel, work: Work) -> Result<Tensor> {
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.waiting.push(Request { id, model, work });
        loop {
            if let Some(answer) = st.answers.remove(&id) {
                return answer;
            }
            st = self.lead_if_ready(st);
            if let Some(answer) = st.answers.remove(&id) {
                return answer;
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// When every member waits and no batch runs, runs the waiting requests (this thread
    /// leading) and answers them; returns the lock.
    fn lead_if_ready<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        if st.running || st.waiting.is_empty() || st.waiting.len() < st.members {
            return st;
        }
        st.running = true;
        let batch = std::mem::take(&mut st.waiting);
        drop(st);
        let ids: Vec<u64> = batch.iter().map(|r| r.id).collect();
        let (answers, stats) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(batch))).unwrap_or_else(|_| {
                // Every member of the batch gets an error rather than waiting forever.
                let answers = ids
                    .iter()
                    .map(|&id| (id, Err(candle_core::Error::Msg("a batched forward panicked".into()))))
                    .collect();
                (answers, BatchStats::default())
            });
        let mut st = self.lock();
        st.running = false;
        st.answers.extend(answers);
        st.stats.batches += stats.batches;
        st.stats.requests += stats.requests;
        st.stats.rows += stats.rows;
        st.stats.widest = st.stats.widest.max(stats.widest);
        self.changed.notify_all();
        st
    }
}

/// A queued forward: request id, tokens, positions, bias and the member's cache.
type QueuedForward = (u64, Vec<u32>, Vec<u32>, Tensor, *mut KvCache);

/// Runs a batch: the forwards of each model as one batched forward, then the logits of each
/// model as one product; every request gets its answer (an error of its group's run, if any).
fn run(batch: Vec<Request>) -> (Vec<(u64, Result<Tensor>)>, BatchStats) {
    let mut stats = BatchStats::default();
    let mut answers = Vec::with_capacity(batch.len());
    let mut forwards: Vec<(*const DecoderModel, Vec<QueuedForward>)> = Vec::new();
    let mut logits: Vec<(*const DecoderModel, Vec<(u64, Tensor)>)> = Vec::new();
    for r in batch {
        match r.work {
            Work::Forward { tokens, positions, bias, cache } => {
                match forwards.iter_mut().find(|(m, _)| *m == r.model) {
                    Some((_, g)) => g.push((r.id, tokens, positions, bias, cache)),
                    None => forwards.push((r.model, vec![(r.id, tokens, positions, bias, cache)])),
                }
            }
            Work::Logits { hidden } => match logits.iter_mut().find(|(m, _)| *m == r.model) {
                Some((_, g)) => g.push((r.id, hidden)),
                None => logits.push((r.model, vec![(r.id, hidden)])),
            },
        }
    }
    for (model, mut group) in forwards {
        // SAFETY: see `Request`: the model and the caches are the waiting members'.
        let model = unsafe { &*model };
        // A sequence that cannot run (a position past the context, a full cache) gets its own
        // error; the others run.
        group.retain(|(id, tokens, positions, bias, cache)| {
            match model.check_forward(tokens, positions, bias, unsafe { &**cache }) {
                Ok(()) => true,
                Err(e) => {
                    answers.push((*id, Err(e)));
                    false
                }
            }
        });
        if group.is_empty() {
            continue;
        }
        let mut items: Vec<BatchItem> = group
            .iter()
            .map(|(_, tokens, positions, bias, cache)| BatchItem {
                tokens,
                positions,
                bias,
                cache: unsafe { &mut **cache },
            })
            .collect();
        stats.batches += 1;
        stats.requests += group.len() as u64;
        stats.rows += group.iter().map(|g| g.1.len() as u64).sum::<u64>();
        stats.widest = stats.widest.max(group.len() as u64);
        match model.forward_batch(&mut items) {
            Ok(hidden) => answers.extend(group.iter().map(|g| g.0).zip(hidden.into_iter().map(Ok))),
            Err(e) => answers.extend(group.iter().map(|g| (g.0, Err(candle_core::Error::Msg(crate::plain_error(&e)))))),
        }
    }
    for (model, group) in logits {
        let model = unsafe { &*model };
        stats.batches += 1;
        stats.requests += group.len() as u64;
        let result = (|| -> Result<Vec<Tensor>> {
            if group.len() == 1 {
                return Ok(vec![model.logits_now(&group[0].1)?]);
            }
            let hidden: Vec<&Tensor> = group.iter().map(|g| &g.1).collect();
            let all = model.logits_now(&Tensor::cat(&hidden, 0)?)?;
            let mut start = 0;
            let mut out = Vec::with_capacity(group.len());
            for h in &hidden {
                let n = h.dim(0)?;
                out.push(all.narrow(0, start, n)?);
                start += n;
            }
            Ok(out)
        })();
        match result {
            Ok(l) => answers.extend(group.iter().map(|g| g.0).zip(l.into_iter().map(Ok))),
            Err(e) => answers.extend(group.iter().map(|g| (g.0, Err(candle_core::Error::Msg(crate::plain_error(&e)))))),
        }
    }
    (answers, stats)
}

impl DecoderModel {
    /// [`Self::forward`] through the batcher the calling thread is a member of, if any.
    pub(crate) fn forward_via_batcher(
        &self,
        tokens: &[u32],
        positions: &[u32],
        bias: &Tensor,
        cache: &mut KvCache,
    ) -> Option<Result<Tensor>> {
        let batcher = Batcher::current()?;
        let work = Work::Forward { tokens: tokens.to_vec(), positions: positions.to_vec(), bias: bias.clone(), cache };
        Some(batcher.submit(self, work))
    }

    /// [`Self::logits`] through the batcher the calling thread is a member of, if any.
    pub(crate) fn logits_via_batcher(&self, hidden: &Tensor) -> Option<Result<Tensor>> {
        let batcher = Batcher::current()?;
        Some(batcher.submit(self, Work::Logits { hidden: hidden.clone() }))
    }
}
