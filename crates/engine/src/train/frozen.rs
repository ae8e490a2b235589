//! A product with a frozen matrix whose backward pass computes only the input's gradient.
//!
//! candle's `Tensor::matmul` backward computes both arguments' gradients whether or not they
//! are trained. For the head's logits `g · W^T` through the target's frozen output layer
//! (`W`: `[draft_vocab, hidden]`, 32,768 x 1,536 for the default target) that is a second
//! product as large as the forward one, `g^T · dL/dlogits`, and a 200 MB gradient nobody reads,
//! at every training step. [`frozen_product`] computes the same forward and the same input
//! gradient `dL/dlogits · W`, with the same candle products (so the bits are those of the plain
//! `matmul`, tested), and nothing for `W`.

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};

/// `x · w^T` (`x`: `[.., k]`, `w`: `[n, k]`), differentiable in `x` only. On the CPU in `f32`
/// the backward pass skips `w`'s gradient; elsewhere this is the plain `matmul` (a GPU computes
/// the extra product quickly, and the custom op has no device kernel).
pub fn frozen_product(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let f32_cpu = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    if f32_cpu(x) && f32_cpu(w) {
        x.contiguous()?.apply_op1(FrozenProduct { w: w.contiguous()? })
    } else {
        x.matmul(&w.t()?)
    }
}

struct FrozenProduct {
    /// `[n, k]`, contiguous `f32`, on the CPU.
    w: Tensor,
}

impl CustomOp1 for FrozenProduct {
    fn name(&self) -> &'static str {
        "frozen-product"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = super::contiguous_f32(storage, layout, "frozen-product")?;
        let y = Tensor::from_slice(x, layout.shape(), &Device::Cpu)?.matmul(&self.w.t()?)?;
        Ok((CpuStorage::F32(y.flatten_all()?.to_vec1()?), y.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        // d(x w^T)/dx applied to grad_y, written as the plain matmul's backward writes it
        // (`grad.matmul(&rhs.t())` with `rhs = w.t()`), so the bits agree.
        Ok(Some(grad_y.matmul(&self.w.t()?.t()?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    fn inputs() -> Result<(Var, Tensor, Tensor)> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (7, 24), &dev)?)?;
        let w = Tensor::randn(0f32, 1.0, (40, 24), &dev)?;
        let target = Tensor::randn(0f32, 1.0, (7, 40), &dev)?;
        Ok((x, w, target))
    }

    /// The same forward and input gradient, bit for bit, as `matmul` with a transposed matrix.
    #[test]
    fn forward_and_input_gradient_equal_the_plain_product() -> Result<()> {
        let (x, w, target) = inputs()?;
        let loss = |y: &Tensor| -> Result<Tensor> { candle_nn::ops::log_softmax(y, 1)?.mul(&target)?.sum_all() };
        let plain = x.as_tensor().matmul(&w.t()?)?;
        let frozen = frozen_product(x.as_tensor(), &w)?;
        assert_eq!(plain.to_vec2::<f32>()?, frozen.to_vec2::<f32>()?);
        let (g_plain, g_frozen) = (loss(&plain)?.backward()?, loss(&frozen)?.backward()?);
        let (a, b) = (g_plain.get(x.as_tensor()).unwrap(), g_frozen.get(x.as_tensor()).unwrap());
        assert_eq!(a.to_vec2::<f32>()?, b.to_vec2::<f32>()?);
        // And that gradient is right: against a finite difference of the loss in one entry.
        let eps = 1e-2f64;
        let bump = |s: f64| -> Result<f64> {
            let mut v = x.as_tensor().to_vec2::<f32>()?;
            v[2][5] += s as f32;
            let xs = Tensor::new(v, &Device::Cpu)?;
            loss(&xs.matmul(&w.t()?)?)?.to_dtype(DType::F64)?.to_scalar::<f64>()
        };
        let numeric = (bump(eps)? - bump(-eps)?) / (2.0 * eps);
        let analytic = b.to_vec2::<f32>()?[2][5] as f64;
        assert!((numeric - analytic).abs() < 1e-2 * (1.0 + numeric.abs()), "{numeric} against {analytic}");
        Ok(())
    }

    /// The backward pass leaves the frozen matrix out, where `matmul`'s computes its gradient.
    #[test]
    fn the_frozen_matrix_gets_no_gradient() -> Result<()> {
        let (x, w, _) = inputs()?;
        let wt = w.t()?;
        let plain = x.as_tensor().matmul(&wt)?.sum_all()?.backward()?;
        assert!(plain.get(&wt).is_some(), "matmul's backward computes the frozen side's gradient");
        let wc = w.contiguous()?;
        let frozen = frozen_product(x.as_tensor(), &wc)?.sum_all()?.backward()?;
        assert!(frozen.get(&wc).is_none() && frozen.get(&w).is_none());
        assert!(frozen.get(x.as_tensor()).is_some());
        Ok(())
    }
}
