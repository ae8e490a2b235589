//! Element-wise activations on host rows: the gated MLP's `silu(g) * u`.

/// `g = silu(g) * u` element-wise; large inputs (several rows) split over the CPU worker pool (`cpu_pool`),
/// with the same arithmetic per element, so the result does not depend on the split.
pub(crate) fn silu_gate(g: &mut [f32], u: &[f32]) {
    /// Below this many elements one thread is faster than a dispatch (about 40 us of work).
    const PARALLEL_MIN: usize = 16_384;
    fn apply(g: &mut [f32], u: &[f32]) {
        for (a, b) in g.iter_mut().zip(u) {
            *a = *a / (1.0 + super::simd::exp(-*a)) * b;
        }
    }
    if g.len() < PARALLEL_MIN {
        return apply(g, u);
    }
    let (base, len) = (g.as_mut_ptr() as usize, g.len());
    super::pool::pool().execute_chunked(len, |r| {
        // SAFETY: the ranges are disjoint and within `g`, which outlives the dispatch.
        let g = unsafe { std::slice::from_raw_parts_mut((base as *mut f32).add(r.start), r.len()) };
        apply(g, &u[r]);
    });
}

#[cfg(test)]
mod tests {
    /// The gate split over the pool equals one thread's loop bit for bit, at sizes below and
    /// above the split threshold.
    #[test]
    fn parallel_gate_equals_the_serial_loop() {
        for len in [7, 4_864, 16_384, 3 * 8_960 + 5] {
            let g0: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
            let u: Vec<f32> = (0..len).map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.31).collect();
            let mut want = g0.clone();
            for (a, b) in want.iter_mut().zip(&u) {
                *a = *a / (1.0 + super::super::simd::exp(-*a)) * b;
            }
            let mut got = g0;
            super::silu_gate(&mut got, &u);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "length {len}");
        }
    }
}
