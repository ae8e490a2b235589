//! EAGLE-1's token loss with soft labels, fused: per row `CE(p, q) = -Σ_v p_v log q_v`,
//! `q = softmax(l)`, and its gradient `dCE/dl_v = q_v Σ_u p_u - p_v`, each in one pass over the
//! row.
//!
//! Written with candle's operations (`log_softmax`, a product, a sum) the loss makes about
//! twenty passes over `[rows, draft_vocab]` tensors a step (512 x 32,768 f32: 64 MiB each),
//! forward and backward, each into a fresh allocation. Here the forward reads the logits and
//! the labels once, and the backward writes the gradient once. Rows are independent and each
//! is summed in a fixed order, in `f64` (the exponentials in `f32`): the result does not depend
//! on the thread count.

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Result, Shape, Storage, Tensor, D};
use std::sync::Mutex;

/// `[rows]`: `-Σ_v p[r, v] · log softmax(logits[r])_v` for `logits`, `p`: `[rows, vocab]`,
/// differentiable in `logits` (`p` is a constant). On the CPU in `f32` this is the fused op;
/// elsewhere candle's `log_softmax` composition (the same function).
pub fn soft_cross_entropy(logits: &Tensor, p: &Tensor) -> Result<Tensor> {
    let fused = logits.device().is_cpu()
        && p.device().is_cpu()
        && logits.dtype() == candle_core::DType::F32
        && p.dtype() == candle_core::DType::F32
        && logits.rank() == 2
        && logits.dims() == p.dims();
    if fused {
        let p = p.detach().contiguous()?;
        logits.contiguous()?.apply_op1(SoftCrossEntropy { p, lse: Mutex::new(Vec::new()) })
    } else {
        composed(logits, p)
    }
}

/// The loss as candle's operations write it (the reference of the fused op).
pub fn composed(logits: &Tensor, p: &Tensor) -> Result<Tensor> {
    let log_q = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    (p.detach() * log_q)?.sum(D::Minus1)?.neg()
}

/// A buffer that the pool's chunks write at disjoint places.
struct SharedRows<T>(*mut T);
// SAFETY: the chunks of one dispatch write disjoint elements, and the buffer outlives it.
unsafe impl<T> Sync for SharedRows<T> {}
impl<T> SharedRows<T> {
    /// # Safety
    /// `i` is in bounds and no other thread touches element `i` meanwhile.
    unsafe fn at(&self, i: usize) -> *mut T {
        self.0.add(i)
    }
}

struct SoftCrossEntropy {
    /// `[rows, vocab]`, contiguous `f32` on the CPU.
    p: Tensor,
    /// Each row's `log Σ_v exp(l_v)`, kept by the forward for the backward.
    lse: Mutex<Vec<f64>>,
}

/// The `f32` values of a contiguous CPU tensor, in place.
fn with_f32<T>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<T>) -> Result<T> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(storage) = &*storage else {
        candle_core::bail!("soft-cross-entropy: a CPU tensor is required");
    };
    f(super::contiguous_f32(storage, layout, "soft-cross-entropy")?)
}

/// `log Σ exp` of a row: `f32` exponentials of `x - max`, summed in order in `f64`.
fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = row.iter().map(|&x| (x - m).exp() as f64).sum();
    m as f64 + s.ln()
}

impl CustomOp1 for SoftCrossEntropy {
    fn name(&self) -> &'static str {
        "soft-cross-entropy"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let logits = super::contiguous_f32(storage, layout, "soft-cross-entropy")?;
        let (rows, vocab) = layout.shape().dims2()?;
        let mut out = vec![(0f32, 0f64); rows];
        let cells = SharedRows(out.as_mut_ptr());
        with_f32(&self.p, |p| {
            crate::kernels::pool::chunked(rows * vocab, rows, |range| {
                for r in range {
                    let (l, p) = (&logits[r * vocab..][..vocab], &p[r * vocab..][..vocab]);
                    let lse = log_sum_exp(l);
                    // Σ p (lse - l) = -Σ p log q.
                    let ce: f64 = l.iter().zip(p).map(|(&l, &p)| p as f64 * (lse - l as f64)).sum();
                    // SAFETY: each row is written by the one chunk that holds it; `out` outlives
                    // the dispatch.
                    unsafe { *cells.at(r) = (ce as f32, lse) };
                }
            });
            Ok(())
        })?;
        let (loss, lse): (Vec<f32>, Vec<f64>) = out.into_iter().unzip();
        *self.lse.lock().expect("not poisoned") = lse;
        Ok((CpuStorage::F32(loss), Shape::from(rows)))
    }

    fn bwd(&self, logits: &Tensor, _loss: &Tensor, grad_loss: &Tensor) -> Result<Option<Tensor>> {
        let (rows, vocab) = logits.dims2()?;
        let g = grad_loss.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?;
        let lse = self.lse.lock().expect("not poisoned").clone();
        if g.len() != rows || lse.len() != rows {
            candle_core::bail!("soft-cross-entropy: backward before forward");
        }
        let mut grad = vec![0f32; rows * vocab];
        let cells = SharedRows(grad.as_mut_ptr());
        with_f32(logits, |l| {
            with_f32(&self.p, |p| {
                crate::kernels::pool::chunked(rows * vocab, rows, |range| {
                    for r in range {
                        let (l, p) = (&l[r * vocab..][..vocab], &p[r * vocab..][..vocab]);
                        // SAFETY: row `r` of `grad` is written by the one chunk that holds it.
                        let out = unsafe { std::slice::from_raw_parts_mut(cells.at(r * vocab), vocab) };
                        let mass: f64 = p.iter().map(|&p| p as f64).sum();
                        let (scale, lse) = (g[r] as f64, lse[r] as f32);
                        for ((o, &l), &p) in out.iter_mut().zip(l).zip(p) {
                            let q = (l - lse).exp() as f64;
                            *o = (scale * (q * mass - p as f64)) as f32;
                        }
                    }
                });
                Ok(())
            })
        })?;
        Ok(Some(Tensor::from_vec(grad, (rows, vocab), &Device::Cpu)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Var};

    /// Logits and labels like training's: rows of spread logits, labels a softmax of others
    /// (one row with all its mass on one token, one with a label mass short of 1).
    fn inputs(rows: usize, vocab: usize) -> Result<(Var, Tensor)> {
        let dev = Device::Cpu;
        let l = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (rows, vocab), &dev)? * 4.0)?)?;
        let mut p = candle_nn::ops::softmax_last_dim(&(Tensor::randn(0f32, 1.0, (rows, vocab), &dev)? * 3.0)?)?
            .to_vec2::<f32>()?;
        p[0] = vec![0.0; vocab];
        p[0][vocab / 2] = 1.0;
        for v in &mut p[1] {
            *v *= 0.75;
        }
        Ok((l, Tensor::new(p, &dev)?))
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
    }

    /// The fused loss and its gradient equal candle's composition to f32 rounding, on one
    /// thread and (the larger size) split over the worker pool.
    #[test]
    fn fused_loss_and_gradient_equal_the_composition() -> Result<()> {
        for (rows, vocab) in [(9, 1000), (40, 4000)] {
            equal_to_the_composition(rows, vocab)?;
        }
        Ok(())
    }

    fn equal_to_the_composition(rows: usize, vocab: usize) -> Result<()> {
        let (l, p) = inputs(rows, vocab)?;
        let weight = Tensor::arange(1f32, rows as f32 + 1.0, &Device::Cpu)?;
        let fused = soft_cross_entropy(l.as_tensor(), &p)?;
        let reference = composed(l.as_tensor(), &p)?;
        assert!(max_abs_diff(&fused, &reference)? < 1e-4, "{fused} against {reference}");
        // Weighted, so that each row's gradient carries its own factor.
        let gf = (&fused * &weight)?.sum_all()?.backward()?;
        let gr = (&reference * &weight)?.sum_all()?.backward()?;
        let (gf, gr) = (gf.get(l.as_tensor()).unwrap(), gr.get(l.as_tensor()).unwrap());
        let scale = gr.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        assert!(max_abs_diff(gf, gr)? < 1e-5 * scale.max(1.0), "gradients differ");
        Ok(())
    }

    /// The gradient is right: against a central difference of the loss in a few entries.
    #[test]
    fn gradient_matches_a_finite_difference() -> Result<()> {
        let (l, p) = inputs(3, 50)?;
        let grads = soft_cross_entropy(l.as_tensor(), &p)?.sum_all()?.backward()?;
        let g = grads.get(l.as_tensor()).unwrap().to_vec2::<f32>()?;
        let base = l.as_tensor().to_vec2::<f32>()?;
        for (r, v) in [(0, 25), (1, 7), (2, 49)] {
            let at = |e: f32| -> Result<f64> {
                let mut x = base.clone();
                x[r][v] += e;
                let t = Tensor::new(x, &Device::Cpu)?;
                soft_cross_entropy(&t, &p)?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()
            };
            let numeric = (at(1e-2)? - at(-1e-2)?) / 2e-2;
            assert!((numeric - g[r][v] as f64).abs() < 2e-3, "({r}, {v}): {numeric} against {}", g[r][v]);
        }
        Ok(())
    }

    /// Rows do not depend on the others: the loss of a row alone (on this thread) equals its
    /// loss in the batch (split over the pool), bit for bit.
    #[test]
    fn rows_are_independent_of_the_batch() -> Result<()> {
        let (l, p) = inputs(40, 4000)?;
        let all = soft_cross_entropy(l.as_tensor(), &p)?.to_vec1::<f32>()?;
        for (r, batched) in all.iter().enumerate() {
            let one = soft_cross_entropy(&l.as_tensor().narrow(0, r, 1)?, &p.narrow(0, r, 1)?)?;
            assert_eq!(one.to_vec1::<f32>()?[0].to_bits(), batched.to_bits(), "row {r}");
        }
        Ok(())
    }
}
