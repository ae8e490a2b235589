//! Generations run several at once for a list of inputs ([`in_order`]): `generate --jsonl
//! --max-batch N` and `train-eagle`'s answers. Part of the `mdsd` binary (`main.rs`).

use anyhow::Context;
use engine::decode::Generator;
use engine::model::{BatchStats, Batcher};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

/// Runs `work` on each of `items`, as many at once as there are `generators`: each generator on
/// a thread of its own taking the next item, their forwards batched ([`Batcher`]) when there
/// are several (alone, a generation runs its forwards itself). Each result goes to `emit`, with
/// its item's index, in the items' order, as soon as every earlier one has. When `emit` fails,
/// no further item is started and its error is returned once the running ones end. Returns the
/// batcher's statistics.
pub fn in_order<'m, T: Sync, R: Send>(
    generators: Vec<Generator<'m>>,
    items: &[T],
    work: impl Fn(&mut Generator<'m>, &T) -> R + Sync,
    mut emit: impl FnMut(usize, R) -> anyhow::Result<()>,
) -> anyhow::Result<BatchStats> {
    let workers = generators.len();
    let batcher = Batcher::new();
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, R)>();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for mut generator in generators {
            let (tx, next, batcher, work) = (tx.clone(), &next, &batcher, &work);
            std::thread::Builder::new()
                .name("mdsd-batched".into())
                .spawn_scoped(scope, move || {
                    let _member = (workers > 1).then(|| batcher.join());
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(item) = items.get(i) else { break };
                        if tx.send((i, work(&mut generator, item))).is_err() {
                            break;
                        }
                    }
                })
                .context("starting a generation thread")?;
        }
        drop(tx);
        let mut ready = BTreeMap::new();
        let mut emitted = 0;
        for (i, result) in rx {
            ready.insert(i, result);
            while let Some(result) = ready.remove(&emitted) {
                if let Err(e) = emit(emitted, result) {
                    next.store(items.len(), Ordering::SeqCst);
                    return Err(e);
                }
                emitted += 1;
            }
        }
        Ok(())
    })?;
    Ok(batcher.stats())
}
