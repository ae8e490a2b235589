//! Means and standard errors for benchmark tables.

/// A mean with its standard error.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MeanSe {
    pub mean: f64,
    pub se: f64,
    /// Number of independent units (questions, prompts) behind the standard error.
    pub n: usize,
}

impl MeanSe {
    /// Mean and standard error of independent values (`se = sd / sqrt(n)`, 0 when `n < 2`).
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self { mean: f64::NAN, se: f64::NAN, n };
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let se = if n < 2 {
            0.0
        } else {
            let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            (var / n as f64).sqrt()
        };
        Self { mean, se, n }
    }

    /// Pooled mean of clustered values given per cluster as `(sum, count)`, with the
    /// cluster-robust standard error of a ratio estimator:
    /// `se^2 = G/(G-1) * sum_g (S_g - mean * n_g)^2 / N^2`. Positions of one generated response
    /// are correlated; treating them as independent would understate the error.
    pub fn clustered(clusters: &[(f64, usize)]) -> Self {
        let g = clusters.iter().filter(|c| c.1 > 0).count();
        let total: usize = clusters.iter().map(|c| c.1).sum();
        if total == 0 {
            return Self { mean: f64::NAN, se: f64::NAN, n: 0 };
        }
        let mean = clusters.iter().map(|c| c.0).sum::<f64>() / total as f64;
        let se = if g < 2 {
            0.0
        } else {
            let ss: f64 = clusters.iter().map(|&(s, k)| (s - mean * k as f64).powi(2)).sum();
            (g as f64 / (g - 1) as f64 * ss).sqrt() / total as f64
        };
        Self { mean, se, n: g }
    }

    /// `mean ± se` with `digits` decimals (after scaling by `scale`).
    pub fn show(&self, scale: f64, digits: usize) -> String {
        if self.mean.is_nan() {
            return "-".into();
        }
        format!("{:.*} ± {:.*}", digits, self.mean * scale, digits, self.se * scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn independent_mean_and_se() {
        let m = MeanSe::of(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m.mean, 2.5);
        // sd = sqrt(5/3), se = sd / 2
        assert!((m.se - (5.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-12);
        assert_eq!(MeanSe::of(&[7.0]).se, 0.0);
    }

    #[test]
    fn clustered_equals_independent_for_singletons() {
        let v = [0.2, 0.9, 0.4, 0.7, 0.5];
        let c: Vec<(f64, usize)> = v.iter().map(|&x| (x, 1)).collect();
        let (a, b) = (MeanSe::clustered(&c), MeanSe::of(&v));
        assert!((a.mean - b.mean).abs() < 1e-12);
        // With unit clusters the robust variance is sum (x - m)^2 * G/(G-1) / G^2 = var/G.
        assert!((a.se - b.se).abs() < 1e-12, "{} vs {}", a.se, b.se);
    }

    #[test]
    fn clustered_pools_by_count() {
        // Cluster 1: 3 positions summing to 3 (mean 1); cluster 2: 1 position of 0.
        let m = MeanSe::clustered(&[(3.0, 3), (0.0, 1)]);
        assert!((m.mean - 0.75).abs() < 1e-12);
        assert!(m.se > 0.0 && m.n == 2);
    }
}
