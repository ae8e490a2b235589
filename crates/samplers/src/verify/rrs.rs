//! Recursive rejection sampling (paper, appendix A.1).
//!
//! With `p_1 = p`, `q_1 = q`: draft `x_k` is accepted with probability
//! `min(1, p_k(x_k) / q_k(x_k))`; on rejection `p_{k+1} = Res^{p_k - q_k}`, the residual
//! `(p_k - q_k)_+ / sum (p_k - q_k)_+`, and `q_{k+1} = q` (RRS-w) or `q_k` without `x_k`,
//! renormalised (RRS-wo). After the last rejection the output is drawn from `p_{n+1}`.
//!
//! Closed form of the residuals: `p_k = (p - S_k q)_+ / Z_k` with `S_1 = 0`, `Z_1 = 1`,
//! `S_{k+1} = S_k + Z_k / z_k` (`z_k`: the mass of `q` not yet removed, 1 for RRS-w) and
//! `Z_{k+1} = sum (p - S_{k+1} q)_+`. Indeed, where `p > S_k q`,
//! `(p_k - q/z_k)_+ = (p - S_{k+1} q)_+ / Z_k`, and elsewhere both sides are 0. A rejected token
//! `x` has `p(x) < S_{k+1} q(x)`, so its residual stays 0 and RRS-wo needs no mask. A rejection
//! therefore costs one read-only pass for `Z_{k+1}` (with block sums for the final draw), and
//! nothing of vocabulary size is written.
//!
//! `S_k` is kept as `s * q_scale` (see [`Split`]): when the undrafted mass `z_k` falls below
//! [`SMALLEST_MASS`], `q_scale` is multiplied by a power of two that lifts it back, and `s`
//! divided by the same, so that `Z_k / z_k` cannot overflow.

use super::{accept_ratio, split_sums, Residual, Split, VerifyScratch};
use crate::dist::rest_mass;
use crate::TokenId;

pub(super) fn walk(
    p: &[f64],
    q: &[f64],
    drafts: &[TokenId],
    without_replacement: bool,
    scratch: &mut VerifyScratch,
    visit: &mut dyn FnMut(usize, f64) -> bool,
) -> Residual {
    // p_k = (p - s q_scale q)_+ / z; `zq` is the undrafted mass of q.
    let (mut s, mut z, mut q_scale) = (0.0f64, 1.0f64, 1.0f64);
    let mut zq = 1.0;
    let mut removed_mass = 0.0;
    scratch.removed.clear();
    let positive_part = |s: f64, q_scale: f64| Split { threshold: s, low_scale: 0.0, q_scale };
    let residual = |s: f64, z: f64, q_scale: f64| {
        if s > 0.0 {
            Residual::Split(positive_part(s, q_scale), z)
        } else {
            Residual::Target
        }
    };
    for (k, &d) in drafts.iter().enumerate() {
        let d = d as usize;
        let pk = (p[d] - s * (q[d] * q_scale)).max(0.0) / z;
        let a = accept_ratio(pk, q[d] / zq);
        if visit(k, a) || a >= 1.0 {
            // Taken, or rejection has probability zero: the rest of the walk has no mass.
            return residual(s, z, q_scale);
        }
        if zq * q_scale < SMALLEST_MASS {
            // 2^-1074 <= zq, so at most 2^76 more; exact (powers of two).
            let lift = SMALLEST_MASS / (zq * q_scale);
            let lift = 2f64.powi(lift.log2().ceil() as i32);
            q_scale *= lift;
            s /= lift;
        }
        s += z / (zq * q_scale);
        z = split_sums(p, q, positive_part(s, q_scale), &mut scratch.blocks);
        if z <= 0.0 {
            // p_k == q_k up to round-off: the residual is arbitrary (paper); use p.
            return Residual::Target;
        }
        if without_replacement {
            scratch.removed.push(d as TokenId);
            removed_mass += q[d];
            zq = rest_mass(q, &scratch.removed, 1.0, removed_mass);
            if zq <= 0.0 {
                break;
            }
        }
    }
    residual(s, z, q_scale)
}

/// The smallest undrafted mass `z_k * q_scale` of [`walk`] before `q_scale` is raised:
/// `Z_k / z_k <= 1 / z_k` then stays below 2^1000.
const SMALLEST_MASS: f64 = f64::from_bits(23 << 52); // 2^-1000
