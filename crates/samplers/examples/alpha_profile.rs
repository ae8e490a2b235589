//! Times `alpha*` of one construction on a model-like pair of vocabulary 151,936, many
//! repetitions (for profiling): `alpha_profile [wr|cps|greedy|wor] [N] [REPS]`.
use samplers::{alpha, DraftConstruction as C};
use std::time::Instant;

#[path = "../benches/common/pairs.rs"]
mod pairs;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cons = match args.get(1).map(String::as_str) {
        Some("cps") => C::ConditionalPoisson,
        Some("greedy") => C::Greedy,
        Some("wor") => C::WithoutReplacement,
        _ => C::WithReplacement,
    };
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let reps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(200);
    let (p, q) = pairs::model_like_pair(151_936, 1);
    let mut best = f64::MAX;
    let mut total = 0.0;
    let mut a = 0.0;
    for _ in 0..reps {
        let s = Instant::now();
        a = alpha::alpha_star(cons, &p, &q, n).unwrap();
        let e = s.elapsed().as_secs_f64();
        best = best.min(e);
        total += e;
    }
    println!("{cons} n={n}: alpha* = {a:.9}, best {:.3} ms, mean {:.3} ms", best * 1e3, total / reps as f64 * 1e3);
}
