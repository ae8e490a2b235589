//! Forwards of several generations gathered into one ([`Batcher`]): each generation runs on a
//! thread of its own, single-sequence code unchanged, and joins the batcher
//! ([`Batcher::join`]); while it is a member, every [`DecoderModel::forward`] and
//! [`DecoderModel::logits`] it calls is queued, and so is every [`EagleHead::forward`] and
//! [`EagleHead::logits`]; once every member is waiting in one, the last to arrive runs them all:
//! the forwards of each model as one [`DecoderModel::forward_batch`] (every row's products at
//! once, attention per sequence), those of each EAGLE head as one
//! [`EagleHead::forward_batch`], the logits of each model or head as one product. The others
//! sleep meanwhile and get their own rows.
//!
//! So N concurrent generations advance in lockstep, one batched forward per phase of their
//! steps (draft levels, the target's tree, a chunk of a new prompt), at about the price of one:
//! on the CPU a forward of a few rows costs little more than one row. With the CPU kernels a
//! row's result does not depend on the rows beside it, so each generation emits exactly what
//! it would alone.
//!
//! A member must not block on anything but the batcher for long while it generates (a
//! callback that waits for a slow reader would hold every other generation up).
//!
//! For `--tree auto` knowing the batch, members post what their next step will ask
//! ([`SharedLoad`]: target rows, draft rows per level, expected tokens) and read the sum of the
//! others' ([`others_load`]); a member reads what its last forwards cost as run in their batch
//! ([`take_batched_cost`]: the batch's rows and seconds, not the time spent waiting for the
//! others), and can run forwards of its own outside the batch ([`Solo`], for timing its
//! models alone: the others wait meanwhile, as they wait for any member).

use super::eagle::{EagleHead, HeadItem};
use super::{split_rows, BatchItem, DecoderModel, KvCache};
use candle_core::{Result, Tensor};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

thread_local! {
    /// The batcher this thread is a member of ([`Batcher::join`]), and its member id.
    static MEMBER_OF: RefCell<Option<(Arc<Batcher>, u64)>> = const { RefCell::new(None) };
    /// Forwards run outside the batch ([`Solo`]).
    static SOLO: Cell<bool> = const { Cell::new(false) };
    /// Rows and seconds of the batched runs that answered this thread since the last
    /// [`take_batched_cost`] (rows: the largest forward's; seconds: all summed).
    static COST: Cell<Option<(usize, f64)>> = const { Cell::new(None) };
    /// The ticket of the prompt this thread prefills ([`Prefilling`]).
    static PREFILL: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Tickets of [`Prefilling`], in order of arrival.
static NEXT_PREFILL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// While alive, this thread's forwards prefill a prompt. In a batch, prompts are prefilled one
/// at a time in the order they began (the others' prompt chunks wait; the running generations'
/// steps do not): a burst of n requests then gets its first tokens after 1, 2, ..., n prompts'
/// work instead of all of them after n (every prompt's chunks shared each forward), for the
/// same total work.
pub struct Prefilling {
    was: Option<u64>,
}

impl Prefilling {
    pub fn enter() -> Self {
        let was = PREFILL.with(|p| p.get());
        if was.is_none() {
            let ticket = NEXT_PREFILL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            PREFILL.with(|p| p.set(Some(ticket)));
        }
        Self { was }
    }
}

impl Drop for Prefilling {
    fn drop(&mut self) {
        PREFILL.with(|p| p.set(self.was));
    }
}

/// What a member's next step asks of the batch (or the sum of several members').
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedLoad {
    /// Target rows of the step (its tree's nodes).
    pub target_rows: usize,
    /// Draft rows per draft forward of the step (0: no drafts).
    pub draft_rows: usize,
    /// Tokens the step is expected to emit.
    pub tokens: f64,
}

impl SharedLoad {
    /// Nothing: a batch of one.
    pub const NONE: SharedLoad = SharedLoad { target_rows: 0, draft_rows: 0, tokens: 0.0 };
    /// A member that posted nothing: one row, one token (a plain step, or a prompt's chunk).
    pub const PLAIN: SharedLoad = SharedLoad { target_rows: 1, draft_rows: 0, tokens: 1.0 };
}

/// The sum of what the other members of this thread's batcher posted ([`post_load`]; those that
/// posted nothing count as [`SharedLoad::PLAIN`]), or `None` outside a batcher.
pub fn others_load() -> Option<SharedLoad> {
    let (batcher, me) = MEMBER_OF.with(|m| m.borrow().clone())?;
    let st = batcher.lock();
    let mut sum = SharedLoad::NONE;
    for (id, load) in &st.loads {
        if *id != me {
            let l = load.unwrap_or(SharedLoad::PLAIN);
            sum.target_rows += l.target_rows;
            sum.draft_rows += l.draft_rows;
            sum.tokens += l.tokens;
        }
    }
    Some(sum)
}

/// Posts what this member's next step asks (`None`: forget it, e.g. between generations).
pub fn post_load(load: Option<SharedLoad>) {
    if let Some((batcher, me)) = MEMBER_OF.with(|m| m.borrow().clone()) {
        batcher.lock().loads.insert(me, load);
    }
}

/// The rows and seconds of the batched runs that answered this thread since the last call
/// (`None`: none did, e.g. outside a batcher); resets them.
pub fn take_batched_cost() -> Option<(usize, f64)> {
    COST.with(|c| c.take())
}

/// While alive, this thread's forwards run at once, outside its batcher (the other members wait
/// for them as for any member's work).
pub struct Solo {
    was: bool,
}

impl Solo {
    pub fn enter() -> Self {
        Self { was: SOLO.with(|s| s.replace(true)) }
    }
}

impl Drop for Solo {
    fn drop(&mut self) {
        SOLO.with(|s| s.set(self.was));
    }
}

/// Gathers the forwards of its members (see the module docs).
#[derive(Default)]
pub struct Batcher {
    state: Mutex<State>,
    changed: Condvar,
}

/// What one member asked for: a forward of a sequence, or logits of hidden states, of a model;
/// or a head forward of a sequence's entries, or the head's logits of its outputs, of an EAGLE
/// head (`target`: the model whose embedding and output layer it reads). The forwards' tokens
/// and positions are the member's own slices, not copies (see `Request`).
pub(crate) enum Work {
    Forward {
        model: *const DecoderModel,
        tokens: *const [u32],
        positions: *const [u32],
        bias: Tensor,
        cache: *mut KvCache,
    },
    Logits {
        model: *const DecoderModel,
        hidden: Tensor,
    },
    HeadForward {
        head: *const EagleHead,
        target: *const DecoderModel,
        features: Tensor,
        tokens: *const [u32],
        positions: *const [u32],
        bias: Tensor,
        cache: *mut KvCache,
    },
    HeadLogits {
        head: *const EagleHead,
        target: *const DecoderModel,
        out: Tensor,
    },
}

struct Request {
    id: u64,
    work: Work,
    /// The ticket of the prompt it prefills ([`Prefilling`]).
    prefill: Option<u64>,
}

// SAFETY: the pointers are to a model or head, a cache and token and position slices owned by a member
// thread that waits, without touching them, until its request is answered; only the thread
// running the batch uses them meanwhile.
unsafe impl Send for Request {}

#[derive(Default)]
struct State {
    /// Members (threads between `join` and the end of their membership).
    members: usize,
    waiting: Vec<Request>,
    answers: HashMap<u64, Answer>,
    next_id: u64,
    /// What each member (by id) posted for its next step.
    loads: HashMap<u64, Option<SharedLoad>>,
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
    /// The most sequences one batched EAGLE head forward held.
    pub head_widest: u64,
    /// The most prompts (of [`Prefilling`] members) whose prefill shared one batch: 1 once any
    /// ran, since prompts are prefilled one at a time.
    pub prefills_together: u64,
}

/// A request's answer with the run that computed it.
type Answer = (Result<Tensor>, Run);

/// The rows and seconds of the batched run that answered a request.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    rows: usize,
    secs: f64,
}

/// Membership of a thread in a [`Batcher`]; ends when dropped.
pub struct Membership {
    batcher: Arc<Batcher>,
    id: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        MEMBER_OF.with(|m| *m.borrow_mut() = None);
        let mut st = self.batcher.lock();
        st.members -= 1;
        st.loads.remove(&self.id);
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

    /// Makes the calling thread a member until the returned guard is dropped: its models' and
    /// EAGLE heads' forwards and logits go through this batcher.
    pub fn join(self: &Arc<Self>) -> Membership {
        let id = {
            let mut st = self.lock();
            st.members += 1;
            let id = st.next_id;
            st.next_id += 1;
            st.loads.insert(id, None);
            id
        };
        MEMBER_OF.with(|m| *m.borrow_mut() = Some((Arc::clone(self), id)));
        Membership { batcher: Arc::clone(self), id }
    }

    /// Members now.
    pub fn members(&self) -> usize {
        self.lock().members
    }

    /// Counters of the batches run so far.
    pub fn stats(&self) -> BatchStats {
        self.lock().stats
    }

    /// The batcher the calling thread is a member of.
    pub(crate) fn current() -> Option<Arc<Batcher>> {
        if SOLO.with(|s| s.get()) {
            return None;
        }
        MEMBER_OF.with(|m| m.borrow().as_ref().map(|(b, _)| Arc::clone(b)))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work` (of a model or a head) and waits for its answer (running the batch when
    /// this member is the last to wait).
    pub(crate) fn submit(&self, work: Work) -> Result<Tensor> {
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.waiting.push(Request { id, work, prefill: PREFILL.with(|p| p.get()) });
        let answered = |(answer, run): Answer| {
            COST.with(|c| {
                let (rows, secs) = c.get().unwrap_or((0, 0.0));
                c.set(Some((rows.max(run.rows), secs + run.secs)));
            });
            answer
        };
        loop {
            if let Some(answer) = st.answers.remove(&id) {
                return answered(answer);
            }
            st = self.lead_if_ready(st);
            if let Some(answer) = st.answers.remove(&id) {
                return answered(answer);
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
        // The heaviest model's forwards (the target's) wait while anything else waits (draft
        // levels, head forwards, logits): members drafting then reach their target forwards
        // together, and the target runs once per step for all of them, instead of once per
        // draft level beside the drafts of members whose steps drifted apart. (Among lighter
        // work the same holds: a head forward waits while logits do, so the members' levels
        // fall into step.)
        let weight = |r: &Request| match r.work {
            // SAFETY: see `Request`: the model or head is a waiting member's.
            Work::Forward { model, .. } => unsafe { &*model }.weight_count(),
            Work::HeadForward { head, .. } => unsafe { &*head }.weight_count(),
            Work::Logits { .. } | Work::HeadLogits { .. } => 0,
        };
        let heaviest = st.waiting.iter().map(weight).max().unwrap_or(0);
        let mut batch = std::mem::take(&mut st.waiting);
        // Requests that wait for a later batch.
        let mut hold = |batch: &mut Vec<Request>, later: &dyn Fn(&Request) -> bool| {
            let (held, now) = std::mem::take(batch).into_iter().partition(|r| later(r));
            st.waiting.extend::<Vec<Request>>(held);
            *batch = now;
        };
        if batch.iter().any(|r| weight(r) < heaviest) {
            hold(&mut batch, &|r| weight(r) == heaviest);
        }
        // One prompt's prefill at a time: the earliest begun (see `Prefilling`).
        if let Some(first) = batch.iter().filter_map(|r| r.prefill).min() {
            hold(&mut batch, &|r| r.prefill.is_some_and(|t| t != first));
        }
        let prefills = batch.iter().filter_map(|r| r.prefill).collect::<std::collections::BTreeSet<u64>>().len();
        st.stats.prefills_together = st.stats.prefills_together.max(prefills as u64);
        drop(st);
        let ids: Vec<u64> = batch.iter().map(|r| r.id).collect();
        let (answers, stats) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(batch))).unwrap_or_else(|_| {
                // Every member of the batch gets an error rather than waiting forever.
                let answers = ids
                    .iter()
                    .map(|&id| {
                        (id, (Err(candle_core::Error::Msg("a batched forward panicked".into())), Run::default()))
                    })
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
        st.stats.head_widest = st.stats.head_widest.max(stats.head_widest);
        self.changed.notify_all();
        st
    }
}

/// A queued forward: request id, tokens, positions, bias and the member's cache.
type QueuedForward = (u64, *const [u32], *const [u32], Tensor, *mut KvCache);

/// A queued head forward: request id, features, tokens, positions, bias and the member's head
/// cache.
type QueuedHeadForward = (u64, Tensor, *const [u32], *const [u32], Tensor, *mut KvCache);

/// A head and the target whose embedding and output layer it reads.
type HeadOfTarget = (*const EagleHead, *const DecoderModel);

/// Whose output layer a logits product runs through: a model's, or a head's (its cut of its
/// target's, or the target's whole one).
#[derive(Clone, Copy, PartialEq)]
enum LogitsOf {
    Model(*const DecoderModel),
    Head(HeadOfTarget),
}

/// Adds `item` to the group of `key` (a model or head).
fn add_to_group<K: PartialEq, T>(groups: &mut Vec<(K, Vec<T>)>, key: K, item: T) {
    match groups.iter_mut().find(|(k, _)| *k == key) {
        Some((_, g)) => g.push(item),
        None => groups.push((key, vec![item])),
    }
}

/// Runs one model's or head's queued forwards: a request that fails `check` (a position past
/// the context, a full cache) gets its own error; the others run as one (`forward`: their rows
/// and each one's output, in order) and each gets its answer, or the run's error. Returns how
/// many ran together.
fn run_forward_group<Q>(
    mut group: Vec<Q>,
    id: impl Fn(&Q) -> u64,
    check: impl Fn(&Q) -> Result<()>,
    forward: impl FnOnce(&[Q]) -> (usize, Result<Vec<Tensor>>),
    stats: &mut BatchStats,
    answers: &mut Vec<(u64, Answer)>,
) -> u64 {
    group.retain(|q| match check(q) {
        Ok(()) => true,
        Err(e) => {
            answers.push((id(q), (Err(e), Run::default())));
            false
        }
    });
    if group.is_empty() {
        return 0;
    }
    let started = std::time::Instant::now();
    let (rows, result) = forward(&group);
    let run = Run { rows, secs: started.elapsed().as_secs_f64() };
    stats.batches += 1;
    stats.requests += group.len() as u64;
    stats.rows += rows as u64;
    match result {
        Ok(out) => answers.extend(group.iter().map(&id).zip(out.into_iter().map(|o| (Ok(o), run)))),
        Err(e) => answers.extend(failed(group.iter().map(&id), &e, run)),
    }
    group.len() as u64
}

/// The same error for every request (`ids`) of a failed group's run.
fn failed(ids: impl Iterator<Item = u64>, e: &candle_core::Error, run: Run) -> Vec<(u64, Answer)> {
    let msg = crate::plain_error(e);
    ids.map(|id| (id, (Err(candle_core::Error::Msg(msg.clone())), run))).collect()
}

/// Runs a batch: the forwards of each model as one batched forward, those of each EAGLE head
/// (with its target) as one head forward, then the logits of each model or head as one
/// product; every request gets its answer (an error of its group's run, if any).
fn run(batch: Vec<Request>) -> (Vec<(u64, Answer)>, BatchStats) {
    let mut stats = BatchStats::default();
    let mut answers = Vec::with_capacity(batch.len());
    let mut forwards: Vec<(*const DecoderModel, Vec<QueuedForward>)> = Vec::new();
    let mut head_forwards: Vec<(HeadOfTarget, Vec<QueuedHeadForward>)> = Vec::new();
    let mut logits: Vec<(LogitsOf, Vec<(u64, Tensor)>)> = Vec::new();
    for r in batch {
        match r.work {
            Work::Forward { model, tokens, positions, bias, cache } => {
                add_to_group(&mut forwards, model, (r.id, tokens, positions, bias, cache))
            }
            Work::Logits { model, hidden } => add_to_group(&mut logits, LogitsOf::Model(model), (r.id, hidden)),
            Work::HeadForward { head, target, features, tokens, positions, bias, cache } => {
                add_to_group(&mut head_forwards, (head, target), (r.id, features, tokens, positions, bias, cache))
            }
            Work::HeadLogits { head, target, out } => {
                add_to_group(&mut logits, LogitsOf::Head((head, target)), (r.id, out))
            }
        }
    }
    for (model, group) in forwards {
        // SAFETY: see `Request`: the model, the caches and the slices are the waiting members'.
        let model = unsafe { &*model };
        let check = |(_, tokens, positions, bias, cache): &QueuedForward| unsafe {
            model.check_forward(&**tokens, &**positions, bias, &**cache)
        };
        let forward = |group: &[QueuedForward]| {
            let mut items: Vec<BatchItem> = group
                .iter()
                .map(|(_, tokens, positions, bias, cache)| unsafe {
                    BatchItem { tokens: &**tokens, positions: &**positions, bias, cache: &mut **cache }
                })
                .collect();
            let rows = items.iter().map(|i| i.tokens.len()).sum();
            (rows, model.forward_batch(&mut items))
        };
        let width = run_forward_group(group, |q| q.0, check, forward, &mut stats, &mut answers);
        stats.widest = stats.widest.max(width);
    }
    for ((head, target), group) in head_forwards {
        // SAFETY: see `Request`: the head, the target, the caches and the slices are the
        // waiting members'.
        let (head, target) = unsafe { (&*head, &*target) };
        let check = |(_, features, tokens, positions, bias, cache): &QueuedHeadForward| unsafe {
            head.check_forward(features, &**tokens, &**positions, bias, &**cache)
        };
        let forward = |group: &[QueuedHeadForward]| {
            let mut items: Vec<HeadItem> = group
                .iter()
                .map(|(_, features, tokens, positions, bias, cache)| unsafe {
                    HeadItem { features, tokens: &**tokens, positions: &**positions, bias, cache: &mut **cache }
                })
                .collect();
            let rows = items.iter().map(|i| i.tokens.len()).sum();
            (rows, head.forward_batch(target, &mut items))
        };
        let width = run_forward_group(group, |q| q.0, check, forward, &mut stats, &mut answers);
        stats.widest = stats.widest.max(width);
        stats.head_widest = stats.head_widest.max(width);
    }
    for (of, group) in logits {
        stats.batches += 1;
        stats.requests += group.len() as u64;
        // SAFETY: see `Request`: the model, head and target are the waiting members'.
        let product = |rows: &Tensor| match of {
            LogitsOf::Model(model) => unsafe { &*model }.logits_now(rows),
            LogitsOf::Head((head, target)) => unsafe { &*head }.logits_now(unsafe { &*target }, rows),
        };
        let started = std::time::Instant::now();
        let result = (|| -> Result<Vec<Tensor>> {
            if group.len() == 1 {
                return Ok(vec![product(&group[0].1)?]);
            }
            let rows: Vec<&Tensor> = group.iter().map(|g| &g.1).collect();
            let counts = rows.iter().map(|r| r.dim(0)).collect::<Result<Vec<usize>>>()?;
            split_rows(product(&Tensor::cat(&rows, 0)?)?, counts.into_iter())
        })();
        // Logits add their seconds to the forward's; rows are the forward's.
        let run = Run { rows: 0, secs: started.elapsed().as_secs_f64() };
        match result {
            Ok(l) => answers.extend(group.iter().map(|g| g.0).zip(l.into_iter().map(|l| (Ok(l), run)))),
            Err(e) => answers.extend(failed(group.iter().map(|g| g.0), &e, run)),
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
        Some(batcher.submit(Work::Forward { model: self, tokens, positions, bias: bias.clone(), cache }))
    }

    /// [`Self::logits`] through the batcher the calling thread is a member of, if any.
    pub(crate) fn logits_via_batcher(&self, hidden: &Tensor) -> Option<Result<Tensor>> {
        let batcher = Batcher::current()?;
        Some(batcher.submit(Work::Logits { model: self, hidden: hidden.clone() }))
    }
}
