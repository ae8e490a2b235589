//! The CPU kernels' worker pool, built to degrade gracefully when the machine is shared.
//!
//! candle's `barrier_pool` (which our kernels used until the twenty-fifth session) ends every
//! dispatch with the calling thread spinning until *each* worker has run and signalled, and its
//! idle workers spin before they park. On a machine where another busy process holds the
//! cores, a worker that the OS has not scheduled holds up every dispatch for up to a scheduler
//! time slice: on the 2-vCPU VM, beside one other generation, `mdsd generate --no-spec` ran at
//! 4.2 tokens/s with two threads against 15.1 with one (docs/results/README.md#const-cpu-pool).
//!
//! Here a dispatch waits only for work that was actually taken:
//! - items are handed out from a shared cursor, in chunks, and the calling thread takes them
//!   too, so that a job finishes on the caller alone if no worker shows up;
//! - a worker joins a job through a ticket that the caller closes once the cursor is spent;
//!   the caller then waits only for the workers that joined (each holds at most one chunk), and
//!   a worker that wakes later finds the ticket closed and goes back to waiting;
//! - waiting spins for `SPIN` (20 µs) only: then an idle worker parks, and the caller waiting for
//!   the workers inside a job yields the core between checks.
//!
//! Results never depend on which thread ran which chunk: callers promise that `f` computes each
//! item the same way whatever the split ([`WorkerPool::execute_chunked`]).

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a waiting thread spins before it gives up its core: an idle worker then parks, and
/// the caller waiting for workers yields between checks. Short, because on a busy machine a
/// spinning or yielding thread spends the CPU time that the OS would otherwise give to the
/// thread it waits for, and a worker that slept is favoured when woken (on a busy machine 20 us
/// beat 50 and 100 us and adaptive spins of up to 300 or 600 us; on an idle one none was
/// measurably faster: docs/results/README.md#const-cpu-pool-spin).
const SPIN: Duration = Duration::from_micros(20);
/// The ticket's low bits count the workers inside the job; the high bits tag the open job.
const COUNT_BITS: u32 = 16;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

thread_local! {
    /// Set on the pool's workers, and on a caller while it takes chunks: a dispatch from inside
    /// a job runs inline.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// One dispatch: `f` over `0..n_items` in chunks of `chunk`, type-erased.
#[derive(Clone, Copy)]
struct Job {
    run: unsafe fn(*const (), Range<usize>),
    f: *const (),
    n_items: usize,
    chunk: usize,
}

struct Shared {
    /// Generation of the latest job; workers wait for it to change.
    go: AtomicUsize,
    /// `tag << COUNT_BITS | joined`: `tag` is the open job's generation (0: closed), `joined`
    /// the number of workers inside it. A worker joins only while the tag is its generation's.
    ticket: AtomicU64,
    cursor: AtomicUsize,
    /// Written by the dispatching thread only while the ticket is closed with no one inside.
    job: UnsafeCell<Job>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    stop: AtomicBool,
    /// Tests hold the workers back (as a busy machine would not schedule them).
    #[cfg(test)]
    hold: AtomicBool,
}

// SAFETY: `job` is written only while no worker can read it (ticket closed, none joined) and
// read only by workers that joined; the ticket's release/acquire orders the two.
unsafe impl Sync for Shared {}

/// A fixed set of worker threads plus the calling thread, for data-parallel loops.
pub struct WorkerPool {
    shared: &'static Shared,
    workers: Vec<Thread>,
    /// Serializes dispatches from different threads and holds the generation.
    dispatch: Mutex<u64>,
}

impl WorkerPool {
    /// A pool with `n_workers` threads besides the caller (0: everything runs inline).
    pub fn new(n_workers: usize) -> Self {
        assert!(n_workers < COUNT_MASK as usize, "too many workers");
        // Leaked: the pool is process-wide and its workers live as long as the process.
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            go: AtomicUsize::new(0),
            ticket: AtomicU64::new(0),
            cursor: AtomicUsize::new(0),
            job: UnsafeCell::new(Job {
                run: run_erased::<fn(Range<usize>)>,
                f: std::ptr::null(),
                n_items: 0,
                chunk: 1,
            }),
            panic: Mutex::new(None),
            stop: AtomicBool::new(false),
            #[cfg(test)]
            hold: AtomicBool::new(false),
        }));
        let workers = (0..n_workers)
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("mdsd-cpu-{i}"))
                    .spawn(move || worker(shared))
                    .expect("spawning a CPU worker thread")
                    .thread()
                    .clone()
            })
            .collect();
        Self { shared, workers, dispatch: Mutex::new(0) }
    }

    /// Worker threads besides the caller.
    pub fn n_workers(&self) -> usize {
        self.workers.len()
    }

    /// Runs `f` over `0..n_items` in contiguous chunks on the caller and whichever workers come,
    /// and returns when every item is done. `f` must give the same results however the items
    /// are split. A panic in `f` is re-raised here after the job has finished.
    pub fn execute_chunked<F: Fn(Range<usize>) + Sync>(&self, n_items: usize, f: F) {
        if n_items == 0 {
            return;
        }
        if self.workers.is_empty() || IN_POOL.with(|p| p.get()) {
            return f(0..n_items);
        }
        let mut generation = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        *generation = (*generation + 1) & (u64::MAX >> COUNT_BITS);
        if *generation == 0 {
            *generation = 1;
        }
        let g = *generation;
        let shared = self.shared;
        // About eight chunks per thread: few enough that the cursor is not contended, small
        // enough that a worker descheduled while holding one holds up little of the job.
        let chunk = n_items.div_ceil((self.workers.len() + 1) * 8).max(1);
        let job = Job { run: run_erased::<F>, f: &f as *const F as *const (), n_items, chunk };
        // SAFETY: the ticket is closed and no worker is inside (the previous dispatch waited
        // for that before returning), so nothing reads `job` now.
        unsafe { *shared.job.get() = job };
        shared.cursor.store(0, Ordering::Relaxed);
        shared.ticket.store(g << COUNT_BITS, Ordering::Release);
        shared.go.store(g as usize, Ordering::Release);
        for w in &self.workers {
            w.unpark();
        }
        // The caller counts as inside the pool while it takes chunks: a dispatch from `f` runs
        // inline (this thread holds `dispatch`).
        let outer = IN_POOL.with(|p| p.replace(true));
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take_chunks(shared, &job)));
        IN_POOL.with(|p| p.set(outer));
        // Close the ticket: from here no worker joins, and those inside finish their chunk.
        shared.ticket.fetch_and(COUNT_MASK, Ordering::AcqRel);
        wait_until(|| shared.ticket.load(Ordering::Acquire) & COUNT_MASK == 0, std::thread::yield_now);
        // A worker's panic is taken even when the caller's own is re-raised, so that it cannot
        // surface in a later job.
        let theirs = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(generation);
        if let Some(payload) = mine.err().or(theirs) {
            std::panic::resume_unwind(payload);
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.go.fetch_add(1, Ordering::Release);
        for w in &self.workers {
            w.unpark();
        }
    }
}

/// The process's pool: `RAYON_NUM_THREADS` (pinned by [`crate::kernels::threads::pin_thread_count`],
/// physical cores by default) threads in all, the caller included.
pub fn pool() -> &'static WorkerPool {
    static POOL: OnceLock<WorkerPool> = OnceLock::new();
    POOL.get_or_init(|| {
        crate::kernels::threads::pin_thread_count();
        WorkerPool::new(candle_core::utils::get_num_threads().saturating_sub(1))
    })
}

/// Below this many multiply-adds (about 20 us of work) [`chunked`] runs on the calling thread.
const INLINE_WORK: usize = 1 << 16;

/// Runs `f` over the items `0..items`: in chunks on the CPU worker pool
/// when the job is `work` multiply-adds or more than [`INLINE_WORK`], else in one call on this
/// thread. Waking the pool for less costs more than the work, and its workers then wait for a
/// while before they park. `f` must give the same results however the items are split.
pub(crate) fn chunked(work: usize, items: usize, f: impl Fn(Range<usize>) + Sync) {
    if work < INLINE_WORK {
        f(0..items);
    } else {
        pool().execute_chunked(items, f);
    }
}

/// Calls the erased closure.
///
/// # Safety
/// `f` must point to a live `F`.
unsafe fn run_erased<F: Fn(Range<usize>)>(f: *const (), items: Range<usize>) {
    (*(f as *const F))(items)
}

/// Takes chunks from the cursor until it is spent.
fn take_chunks(shared: &Shared, job: &Job) {
    loop {
        let start = shared.cursor.fetch_add(job.chunk, Ordering::Relaxed);
        if start >= job.n_items {
            return;
        }
        // SAFETY: the dispatching thread keeps `f` alive until every joined worker has left.
        unsafe { (job.run)(job.f, start..(start + job.chunk).min(job.n_items)) };
    }
}

/// Waits until `done()` holds: spins for [`SPIN`], then calls `give_up` between checks. The
/// caller waiting for the workers inside a job yields (a worker that holds a chunk but lost its
/// core needs one to finish); an idle worker parks until the next dispatch unparks it.
fn wait_until(done: impl Fn() -> bool, give_up: fn()) {
    let start = Instant::now();
    let mut checks = 0u32;
    while !done() {
        checks = checks.wrapping_add(1);
        if checks.is_multiple_of(32) && start.elapsed() >= SPIN {
            give_up();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn worker(shared: &'static Shared) {
    IN_POOL.with(|p| p.set(true));
    let mut seen = 0usize;
    loop {
        wait_until(|| shared.go.load(Ordering::Acquire) != seen, std::thread::park);
        seen = shared.go.load(Ordering::Acquire);
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        #[cfg(test)]
        while shared.hold.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Join the job of generation `seen` if its ticket is still open.
        let tag = ((seen as u64) & (u64::MAX >> COUNT_BITS)) << COUNT_BITS;
        let mut ticket = shared.ticket.load(Ordering::Acquire);
        let joined = loop {
            if ticket & !COUNT_MASK != tag || tag == 0 {
                break false;
            }
            match shared.ticket.compare_exchange_weak(ticket, ticket + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break true,
                Err(now) => ticket = now,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: joined, so the dispatching thread does not touch `job` or `f` until we leave.
        let job = unsafe { *shared.job.get() };
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take_chunks(shared, &job))) {
            let mut slot = shared.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(payload);
        }
        shared.ticket.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Every item is run exactly once, for many sizes and repeated dispatches.
    #[test]
    fn every_item_runs_once() {
        let pool = WorkerPool::new(3);
        for n in [1usize, 2, 7, 31, 32, 33, 1000, 4097] {
            for _ in 0..50 {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                pool.execute_chunked(n, |r| {
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
            }
        }
    }

    /// Workers take part (a job's chunks land on more than one thread), and a job finishes on
    /// the caller alone while every worker is held up elsewhere.
    #[test]
    fn workers_help_and_are_not_waited_for() {
        let pool = WorkerPool::new(1);
        let mut helped = false;
        for _ in 0..200 {
            let threads = Mutex::new(std::collections::HashSet::new());
            pool.execute_chunked(64, |_| {
                threads.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(Duration::from_micros(200));
            });
            if threads.lock().unwrap().len() > 1 {
                helped = true;
                break;
            }
        }
        assert!(helped, "no worker ever took a chunk");

        // Workers that do not come (held back, as a busy machine would not schedule them): jobs
        // still finish, on the caller alone and without waiting for them, and when the workers
        // come back later they find those jobs closed and do not touch them.
        pool.shared.hold.store(true, Ordering::Release);
        std::thread::sleep(Duration::from_millis(5));
        let t = Instant::now();
        for _ in 0..100 {
            let hits: Vec<AtomicU32> = (0..64).map(|_| AtomicU32::new(0)).collect();
            let caller = std::thread::current().id();
            pool.execute_chunked(64, |r| {
                assert_eq!(std::thread::current().id(), caller);
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        pool.shared.hold.store(false, Ordering::Release);
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        pool.execute_chunked(1000, |r| {
            sum.fetch_add(r.len(), Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 1000);
    }

    /// A panic in `f` reaches the caller, and the pool keeps working after it.
    #[test]
    fn a_panic_reaches_the_caller() {
        let pool = WorkerPool::new(2);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.execute_chunked(100, |r| {
                if r.contains(&57) {
                    panic!("item 57");
                }
            })
        }));
        assert!(caught.is_err());
        let sum = AtomicUsize::new(0);
        pool.execute_chunked(100, |r| {
            sum.fetch_add(r.len(), Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 100);
        // Every chunk panics, on the caller and on the workers that join: the caller's panic is
        // re-raised, and no worker's is left over to surface in the next, clean job.
        for _ in 0..50 {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.execute_chunked(64, |_| {
                    std::thread::sleep(Duration::from_micros(100));
                    panic!("every chunk");
                })
            }));
            assert!(caught.is_err());
            let clean = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.execute_chunked(64, |_| {})));
            assert!(clean.is_ok(), "a panic of the job before surfaced in a clean one");
        }
    }

    /// A dispatch from inside a job runs inline instead of deadlocking.
    #[test]
    fn nested_dispatch_runs_inline() {
        let pool = pool();
        let sum = AtomicUsize::new(0);
        pool.execute_chunked(8, |outer| {
            for _ in outer {
                pool.execute_chunked(10, |inner| {
                    sum.fetch_add(inner.len(), Ordering::Relaxed);
                });
            }
        });
        assert_eq!(sum.load(Ordering::Relaxed), 80);
    }
}
