//! AdamW (Loshchilov and Hutter, "Decoupled Weight Decay Regularization", Algorithm 2) with
//! global-norm gradient clipping, whose moments can be saved and restored (candle-nn's
//! `AdamW` keeps them private, so a run could not be resumed where it stopped).

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use std::collections::BTreeMap;

/// AdamW's settings: `lr` is the step's (the schedule sets it); EAGLE-1 trains with betas (0.9,
/// 0.95) and clips gradients at a global norm of 0.5.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Gradients are scaled down so that their global L2 norm is at most this (0: no clipping).
    pub clip_norm: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.01, clip_norm: 0.5 }
    }
}

/// The optimizer state: first and second moments per variable, and the step count.
pub struct AdamW {
    config: AdamWConfig,
    m: BTreeMap<String, Tensor>,
    v: BTreeMap<String, Tensor>,
    step: u64,
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> Self {
        Self { config, m: BTreeMap::new(), v: BTreeMap::new(), step: 0 }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// One update of `vars` from `grads` at learning rate `lr`; returns the gradients' global
    /// norm before clipping. Variables without a gradient are left alone.
    pub fn step(&mut self, vars: &BTreeMap<String, Var>, grads: &GradStore, lr: f64) -> Result<f64> {
        let c = self.config;
        let mut square_sum = 0f64;
        for var in vars.values() {
            if let Some(g) = grads.get(var.as_tensor()) {
                square_sum += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        let norm = square_sum.sqrt();
        if !norm.is_finite() {
            candle_core::bail!("the gradients' norm is {norm}: the loss diverged (lower the learning rate)");
        }
        let scale = if c.clip_norm > 0.0 && norm > c.clip_norm { c.clip_norm / norm } else { 1.0 };
        self.step += 1;
        let t = self.step as i32;
        let (bias1, bias2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for (name, var) in vars {
            let Some(g) = grads.get(var.as_tensor()) else { continue };
            let g = (g * scale)?;
            let m = match self.m.get(name) {
                Some(m) => ((m * c.beta1)? + (&g * (1.0 - c.beta1))?)?,
                None => (&g * (1.0 - c.beta1))?,
            };
            let v = match self.v.get(name) {
                Some(v) => ((v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?,
                None => (g.sqr()? * (1.0 - c.beta2))?,
            };
            let update = ((&m / bias1)? / ((&v / bias2)?.sqrt()? + c.eps)?)?;
            let w = var.as_tensor();
            let decayed = (w * (1.0 - lr * c.weight_decay))?;
            var.set(&(decayed - (update * lr)?)?)?;
            self.m.insert(name.clone(), m);
            self.v.insert(name.clone(), v);
        }
        Ok(norm)
    }

    /// The state as named tensors (`m.NAME`, `v.NAME`, `step`) for a checkpoint.
    pub fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::with_capacity(2 * self.m.len() + 1);
        for (k, t) in &self.m {
            out.push((format!("m.{k}"), t.clone()));
        }
        for (k, t) in &self.v {
            out.push((format!("v.{k}"), t.clone()));
        }
        let step = Tensor::new(&[self.step as f32], &candle_core::Device::Cpu)?;
        out.push(("step".into(), step));
        Ok(out)
    }

    /// The optimizer with a saved [`Self::state`].
    pub fn from_state(config: AdamWConfig, state: std::collections::HashMap<String, Tensor>) -> Result<Self> {
        let mut o = Self::new(config);
        for (k, t) in state {
            if let Some(name) = k.strip_prefix("m.") {
                o.m.insert(name.to_string(), t);
            } else if let Some(name) = k.strip_prefix("v.") {
                o.v.insert(name.to_string(), t);
            } else if k == "step" {
                o.step = t.to_vec1::<f32>()?.first().copied().unwrap_or(0.0) as u64;
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// On f(w) = sum((w - 3)^2) AdamW walks to 3; a saved and restored optimizer takes the
    /// same next step as the original.
    #[test]
    fn adamw_minimises_a_quadratic_and_resumes_exactly() {
        let dev = Device::Cpu;
        let config = AdamWConfig { weight_decay: 0.0, clip_norm: 0.0, ..Default::default() };
        let w = Var::from_tensor(&Tensor::new(&[0f32, 10.0], &dev).unwrap()).unwrap();
        let vars: BTreeMap<String, Var> = [("w".to_string(), w.clone())].into();
        let mut opt = AdamW::new(config);
        let loss = |w: &Var| (w.as_tensor() - 3.0).unwrap().sqr().unwrap().sum_all().unwrap();
        for _ in 0..2000 {
            let grads = loss(&w).backward().unwrap();
            opt.step(&vars, &grads, 0.05).unwrap();
        }
        let got = w.as_tensor().to_vec1::<f32>().unwrap();
        assert!(got.iter().all(|x| (x - 3.0).abs() < 1e-2), "{got:?}");
        // Resume: the same next step from a restored state.
        let restored = AdamW::from_state(config, opt.state().unwrap().into_iter().collect()).unwrap();
        assert_eq!(restored.steps(), 2000);
        let w2 = Var::from_tensor(w.as_tensor()).unwrap();
        let vars2: BTreeMap<String, Var> = [("w".to_string(), w2.clone())].into();
        let mut restored = restored;
        opt.step(&vars, &loss(&w).backward().unwrap(), 0.05).unwrap();
        restored.step(&vars2, &loss(&w2).backward().unwrap(), 0.05).unwrap();
        assert_eq!(w.as_tensor().to_vec1::<f32>().unwrap(), w2.as_tensor().to_vec1::<f32>().unwrap());
    }

    /// Clipping scales a large gradient down to the clip norm (the first Adam step's size does
    /// not show it, so the second moment is read instead) and reports the norm before it.
    #[test]
    fn clipping_reports_the_norm_and_bounds_the_gradient() {
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[0f32, 0.0], &dev).unwrap()).unwrap();
        let vars: BTreeMap<String, Var> = [("w".to_string(), w.clone())].into();
        let mut opt = AdamW::new(AdamWConfig { clip_norm: 0.5, weight_decay: 0.0, ..Default::default() });
        // Gradient (30, 40): norm 50.
        let loss = (w.as_tensor() * Tensor::new(&[30f32, 40.0], &dev).unwrap()).unwrap().sum_all().unwrap();
        let norm = opt.step(&vars, &loss.backward().unwrap(), 0.1).unwrap();
        assert!((norm - 50.0).abs() < 1e-3, "{norm}");
        let v = opt.v["w"].to_vec1::<f32>().unwrap();
        // Clipped gradient (0.3, 0.4); v = 0.05 g^2.
        assert!((v[0] - 0.05 * 0.09).abs() < 1e-6 && (v[1] - 0.05 * 0.16).abs() < 1e-6, "{v:?}");
    }
}
