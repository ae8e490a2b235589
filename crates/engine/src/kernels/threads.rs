//! candle's CPU thread count, pinned once per process.
//!
//! candle 0.11.1's dense matmul on the CPU asks `candle_core::utils::get_num_threads()` for its
//! thread count on every product. Unless `RAYON_NUM_THREADS` is set, that call counts the
//! physical cores by reading `/proc/cpuinfo` (on Linux), each time: on a 2-core VM a two-token
//! forward of a tiny 2-layer model took 1,040 us, of which the reads were most, against 165 us
//! with the variable set (docs/results/README.md#const-cpu-threads). Our own
//! kernels (quantized and dense f32 rows, attention) do not ask; whatever still runs through
//! candle's dense CPU matmul does.

use std::sync::Once;

/// Sets `RAYON_NUM_THREADS` to the count candle would compute (`get_num_threads`, physical cores
/// by default), once, when the variable is unset, so that later products read the variable
/// instead of `/proc/cpuinfo`. A value the user set is left alone. Called by
/// [`crate::model::DecoderModel::new`] and at the start of the binaries.
///
/// The count is what candle used anyway, so candle's behaviour does not change; rayon's global
/// pool, when something else builds it later, takes the same count (candle's own
/// `init_global_threadpool` would too).
pub fn pin_thread_count() {
    static PINNED: Once = Once::new();
    PINNED.call_once(|| {
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            let n = candle_core::utils::get_num_threads();
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        }
    });
}

#[cfg(test)]
mod tests {
    /// After pinning, the variable holds candle's count and candle reads it back.
    #[test]
    fn the_pinned_count_is_candles() {
        let before = std::env::var("RAYON_NUM_THREADS").ok();
        super::pin_thread_count();
        let n: usize = std::env::var("RAYON_NUM_THREADS").unwrap().parse().unwrap();
        assert!(n >= 1);
        assert_eq!(candle_core::utils::get_num_threads(), n);
        if let Some(b) = before {
            assert_eq!(b, n.to_string(), "a user's value was changed");
        }
    }
}
