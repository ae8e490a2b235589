//! Tests of [`super`] (`--tree auto`): the choice, the cost curves, batches and lookups.

use super::*;

/// A new text forgets the acceptance of the last one (back to a fresh state's estimate and
/// choice) and keeps the measured costs.
#[test]
fn a_new_text_forgets_acceptance_and_keeps_costs() {
    let mut a = AutoTree::new(false);
    for (i, rows) in [1usize, 2, 3, 4, 5, 6, 7].into_iter().enumerate() {
        a.target.record(rows, 0.020 + 0.001 * i as f64);
        a.draft.record(rows, 0.006 + 0.001 * i as f64);
    }
    let fresh = a.alphas();
    let first = a.choose();
    for _ in 0..200 {
        a.record_node(1, None);
    }
    assert!(a.alphas()[0][0] < fresh[0][0], "rejections did not lower the estimate");
    a.new_text();
    assert_eq!(a.alphas(), fresh);
    assert_eq!(a.choose(), first);
    assert!(a.target.has(3) && a.draft.has(3), "costs were forgotten");
    assert!(a.uses.iter().all(|&u| u <= 1));
}

/// A change of candidates (a draft temperature of 0, then of 0.7) keeps the measured costs
/// and starts the acceptance afresh; the same candidates keep the whole state.
#[test]
fn other_candidates_keep_the_costs() {
    let mut chains = AutoTree::new(false);
    for rows in [1, 2, 4, 7] {
        chains.target.record(rows, 0.020 + 0.001 * rows as f64);
    }
    chains.draft.record(1, 0.006);
    for _ in 0..50 {
        chains.record_node(1, None);
    }
    let same = chains.clone().for_candidates(false);
    assert_eq!(same.alphas(), chains.alphas());
    let multi = chains.clone().for_candidates(true);
    assert_eq!(multi.trees.len(), AutoTree::new(true).trees.len());
    assert!(multi.trees.len() > chains.trees.len());
    assert_eq!(multi.alphas(), AutoTree::new(true).alphas());
    for rows in [1, 2, 4, 7] {
        assert_eq!(multi.target.at(rows), chains.target.at(rows));
    }
    assert_eq!(multi.draft.at(1), Some(0.006));
    let back = multi.for_candidates(false);
    assert_eq!(back.trees.len(), chains.trees.len());
    assert!(back.target.has(7) && back.draft.has(1));
}

/// `α_{1,0} = c` for single drafts, `α_{2,·} = (a0, a1)` and `α_{3,·} = (b0, b1, b2)`.
fn alphas(c: f64, (a0, a1): (f64, f64), (b0, b1, b2): (f64, f64, f64)) -> Alphas {
    [[c, 0.0, 0.0], [a0, a1, 0.0], [b0, b1, b2]]
}

#[test]
fn expected_tokens_of_a_chain_is_a_geometric_sum() {
    let t = DraftTree::preset("chain-3").unwrap();
    let a: f64 = 0.7;
    let want = 1.0 + a + a * a + a * a * a;
    // A chain only ever uses the single-draft estimate.
    let al = alphas(a, (0.1, 0.2), (0.3, 0.4, 0.5));
    assert!((AutoTree::expected_tokens(&t, &al) - want).abs() < 1e-12);
    assert_eq!(AutoTree::expected_tokens(&DraftTree::root_only(), &al), 1.0);
}

/// Two drafts at a node: P(first accepted) = a0, P(second) = (1-a0) a1. In
/// `chain-2-forks-1` the root has two drafts and the first one a single draft below it
/// (estimate c); three drafts use the third row, and ranks beyond 3 its last entry.
#[test]
fn expected_tokens_by_width_and_rank() {
    let (c, a0, a1) = (0.65, 0.5, 0.4);
    let al = alphas(c, (a0, a1), (0.6, 0.3, 0.2));
    let t = DraftTree::preset("drafts-2-depth-1").unwrap();
    assert!((AutoTree::expected_tokens(&t, &al) - (1.0 + a0 + (1.0 - a0) * a1)).abs() < 1e-12);
    let forked = DraftTree::preset("chain-2-forks-1").unwrap();
    let want = 1.0 + a0 * (1.0 + c) + (1.0 - a0) * a1;
    assert!((AutoTree::expected_tokens(&forked, &al) - want).abs() < 1e-12);
    let three = DraftTree::preset("drafts-3-depth-1").unwrap();
    let want = 1.0 + 0.6 + 0.4 * 0.3 + 0.4 * 0.7 * 0.2;
    assert!((AutoTree::expected_tokens(&three, &al) - want).abs() < 1e-12);
    let four = DraftTree::preset("drafts-4-depth-1").unwrap();
    let want = 1.0 + 0.6 + 0.4 * 0.3 + 0.4 * 0.7 * 0.2 + 0.4 * 0.7 * 0.8 * 0.2;
    assert!((AutoTree::expected_tokens(&four, &al) - want).abs() < 1e-12);
}

/// Verifications count by node width and rank: a node accepting its second draft rejected
/// its first; a chain's draft is counted apart from the first of two.
#[test]
fn acceptance_is_counted_by_width_and_rank() {
    let mut a = AutoTree::new(true);
    let prior = a.alphas();
    for _ in 0..100 {
        a.record_node(1, Some(0)); // a chain's draft accepted
        a.record_node(1, None); // ... rejected
        a.record_node(2, Some(0)); // first of two accepted
        a.record_node(2, Some(1)); // first rejected, second accepted
        a.record_node(2, None); // both rejected
        a.record_node(3, None); // three rejected
    }
    let w = PRIOR_WEIGHT;
    let got = a.alphas();
    // Each rank's estimate over all widths is the prior of every width's own.
    let pooled = [
        (100.0 + 100.0 + prior[0][0] * w) / (200.0 + 300.0 + 100.0 + w),
        (100.0 + prior[1][1] * w) / (200.0 + 100.0 + w),
        (prior[2][2] * w) / (100.0 + w),
    ];
    let want = [
        (0, 0, (100.0 + pooled[0] * w) / (200.0 + w)),
        (1, 0, (100.0 + pooled[0] * w) / (300.0 + w)),
        (1, 1, (100.0 + pooled[1] * w) / (200.0 + w)),
        (2, 0, (pooled[0] * w) / (100.0 + w)),
        (2, 2, (pooled[2] * w) / (100.0 + w)),
    ];
    for (k, j, e) in want {
        assert!((got[k][j] - e).abs() < 1e-12, "alpha[{k}][{j}] = {} against {e}", got[k][j]);
    }
    let summary = a.summary();
    assert!(
        summary.starts_with("alpha 0.50 (1 draft), 0.33 / 0.50 (2 drafts), 0.01 / 0.01 / 0.00 (3 drafts);"),
        "{summary}"
    );
    // Only the widths tried are shown.
    assert!(AutoTree::new(false).summary().starts_with("alpha 0.60 (1 draft);"));
}

/// A width not tried yet starts from what the others showed: after forks' first drafts
/// were accepted 84 times in 100, a chain's draft is expected at about that, not at the
/// prior 0.6, and a cheap chain is tried.
#[test]
fn an_untried_width_starts_from_the_others_acceptance() {
    let mut a = AutoTree::new(true);
    for i in 0..100 {
        a.record_node(
            2,
            if i < 84 {
                Some(0)
            } else if i < 92 {
                Some(1)
            } else {
                None
            },
        );
    }
    let alphas = a.alphas();
    assert!((alphas[0][0] - 0.84).abs() < 0.02, "{alphas:?}");
    assert!((alphas[2][0] - 0.84).abs() < 0.02 && (alphas[2][1] - 0.5).abs() < 0.05, "{alphas:?}");
    // Each target row past the first costs a fifth of the first: the second drafts' 8 in
    // 100 do not pay for their rows.
    for r in 1..=16 {
        a.target.record(r, 0.020 + 0.004 * (r - 1) as f64);
    }
    for r in 1..=9 {
        a.draft.record(r, 0.006 + 0.003 * (r - 1) as f64);
    }
    let pick = a.choose();
    assert!(a.trees[pick].0.starts_with("chain-") && !a.trees[pick].0.contains("forks"), "{}", a.trees[pick].0);
}

#[test]
fn anchors_are_the_ends_and_the_powers_of_two_between() {
    assert_eq!(anchors(&[1, 2, 3, 4, 5, 6, 7, 9, 13, 15]), [1, 2, 4, 8, 15]);
    assert_eq!(anchors(&[2, 3, 8]), [2, 4, 8]);
    assert_eq!(anchors(&[3]), [3]);
    assert!(anchors(&[]).is_empty());
    // Every candidate's rows are covered: at the anchors or between two of them.
    let a = AutoTree::new(true);
    let (target, draft) = a.needed_rows();
    for rows in [target, draft] {
        let anchors = anchors(&rows);
        assert!(rows.iter().all(|r| anchors.first() <= Some(r) && Some(r) <= anchors.last()));
    }
}

#[test]
fn cost_curve_interpolates_and_extrapolates() {
    let mut c = CostCurve::default();
    assert_eq!(c.at(3), None);
    c.record(1, 1.0);
    assert_eq!(c.at(4), Some(4.0)); // one point: proportional
    c.record(3, 2.0);
    assert_eq!(c.at(2), Some(1.5));
    assert_eq!(c.at(5), Some(3.0));
    assert_eq!(c.at(1), Some(1.0));
    c.record(1, 2.0); // moving average
    assert!((c.at(1).unwrap() - 1.2).abs() < 1e-12);
}

/// With a costly target row and a cheap draft, long chains win at high acceptance and
/// no drafts win at low acceptance.
#[test]
fn choice_follows_acceptance_and_cost() {
    let mut a = AutoTree::new(false);
    for r in 1..=7 {
        a.target.record(r, 0.040 + 0.002 * (r - 1) as f64);
    }
    a.draft.record(1, 0.004);
    for _ in 0..50 {
        a.record_node(1, Some(0));
    }
    let pick = a.choose();
    assert_eq!(a.trees[pick].0, "chain-6", "alpha {:?}", a.alphas());
    let mut b = AutoTree::new(false);
    b.target = a.target.clone();
    b.draft.record(1, 0.030);
    for _ in 0..50 {
        b.record_node(1, None);
    }
    let pick = b.choose();
    assert_eq!(b.trees[pick].0, "no-drafts", "alpha {:?}", b.alphas());
    // Exploration: a draft step at the latest every EXPLORE_EVERY steps.
    let picks: Vec<usize> = (0..EXPLORE_EVERY).map(|_| b.choose()).collect();
    assert!(picks.iter().any(|&p| p != 0));
}

/// Target forwards of 25 ms up to 8 rows, then 2.5 ms per row (compute-bound); the draft's a
/// fifth of that; measured up to 200 rows.
fn compute_bound_costs(a: &mut AutoTree) {
    let cost = |r: usize| 0.025 + 0.0025 * r.saturating_sub(8) as f64;
    for r in 1..=200 {
        a.target.record(r, cost(r));
        a.draft.record(r, cost(r) / 5.0);
    }
}

/// Records `accepted` chain drafts accepted and `rejected` rejected.
fn record_chain_drafts(a: &mut AutoTree, accepted: usize, rejected: usize) {
    for _ in 0..accepted {
        a.record_node(1, Some(0));
    }
    for _ in 0..rejected {
        a.record_node(1, None);
    }
}

/// In a batch the trees shrink as the cost curve says: with forwards that cost little more
/// for a few rows and then grow with every row (a CPU's), drafts accepted at 0.7 make a
/// deep chain alone, a shorter one beside three members, and none beside fifteen whose
/// rows already fill the forward; the rate is the batch's (its tokens over its step).
#[test]
fn trees_shrink_as_the_batch_fills() {
    let mut a = AutoTree::new(false);
    compute_bound_costs(&mut a);
    record_chain_drafts(&mut a, 60, 26);
    let depth = |a: &AutoTree, i: usize| a.trees[i].1.max_depth();
    let alone = a.choose_in_batch(&SharedLoad::NONE);
    assert_eq!(alone, a.clone().choose(), "alone, the batch rule is the solo rule");
    let some = SharedLoad { target_rows: 9, draft_rows: 3, tokens: 6.0 };
    let beside_three = a.choose_in_batch(&some);
    let full = SharedLoad { target_rows: 60, draft_rows: 15, tokens: 30.0 };
    let beside_fifteen = a.choose_in_batch(&full);
    assert!(depth(&a, alone) >= 3, "alone: {}", a.trees[alone].0);
    assert!(depth(&a, beside_three) < depth(&a, alone), "beside three: {}", a.trees[beside_three].0);
    assert_eq!(a.trees[beside_fifteen].0, "no-drafts");
    // The rate chosen is the best of the batch's: no candidate gives the batch more.
    let alphas = a.alphas();
    let rate = |i: usize, o: &SharedLoad| {
        (AutoTree::expected_tokens(&a.trees[i].1, &alphas) + o.tokens) / a.batch_step_cost(&a.trees[i].1, o).unwrap()
    };
    for i in 0..a.trees.len() {
        assert!(
            rate(i, &some) <= rate(beside_three, &some) + 1e-12,
            "{} beats {}",
            a.trees[i].0,
            a.trees[beside_three].0
        );
    }
}

/// A draft model that owes many tokens catches up when drafting the rest saves more than the
/// catch-up forward costs: alone with a long answer left, not with one token left, not in a
/// full batch where plain steps win anyway (the choice there is `no-drafts` too); with a cost
/// unknown, it catches up (as its prompt's prefill did). A step that cannot draft takes the
/// plain tree with the choice's bookkeeping.
#[test]
fn a_catch_up_runs_when_drafting_the_rest_pays() {
    let mut a = AutoTree::new(false);
    assert!(a.catch_up_pays(60, 128, &SharedLoad::NONE), "no costs known: catch up");
    compute_bound_costs(&mut a);
    record_chain_drafts(&mut a, 70, 30);
    assert!(a.catch_up_pays(60, 128, &SharedLoad::NONE));
    assert!(!a.catch_up_pays(60, 1, &SharedLoad::NONE), "one token left");
    // The break-even: seconds saved per token times the tokens left against the catch-up
    // (alone, the best rate is the fewest seconds per token).
    let alphas = a.alphas();
    let per_token =
        |t: &DraftTree| a.step_cost_with_lag(t, &SharedLoad::NONE, 1).unwrap() / AutoTree::expected_tokens(t, &alphas);
    let plain = per_token(&a.trees[0].1);
    let best = a.trees[1..].iter().map(|(_, t)| per_token(t)).fold(f64::INFINITY, f64::min);
    let even = a.draft.at(60).unwrap() / (plain - best);
    assert!(even > 2.0 && even < 128.0, "{even}");
    assert!(!a.catch_up_pays(60, even.floor() as usize, &SharedLoad::NONE));
    assert!(a.catch_up_pays(60, even.floor() as usize + 1, &SharedLoad::NONE));
    let full = SharedLoad { target_rows: 60, draft_rows: 15, tokens: 30.0 };
    assert!(!a.catch_up_pays(60, 10_000, &full), "a full batch, where plain steps win");
    assert_eq!(a.trees[a.clone().choose_in_batch(&full)].0, "no-drafts");
    let uses = a.uses[0];
    assert_eq!(a.choose_without_drafts(), 0);
    assert_eq!(a.uses[0], uses + 1);
}

/// In a batch every member waits for a catch-up's forward, so it is weighed with the batch's
/// rate: the tokens the batch gains while the text drafts the rest against the tokens it would
/// have made in the catch-up's seconds. Beside one member taking plain steps, drafting still
/// beats plain steps per step, but the catch-up needs more tokens left to pay than alone; the
/// text's own seconds saved (the rule before) would have caught up from well below the batch's
/// break-even, where the other stream loses more tokens waiting than this text gains.
#[test]
fn a_catch_up_in_a_batch_pays_for_every_member_s_wait() {
    let mut a = AutoTree::new(false);
    compute_bound_costs(&mut a);
    record_chain_drafts(&mut a, 70, 30);
    let alphas = a.alphas();
    let beside = SharedLoad::PLAIN;
    // (batch rate, step seconds over this text's expected tokens) of each tree beside `beside`.
    let rates = |t: &DraftTree| {
        let (e, c) = (AutoTree::expected_tokens(t, &alphas), a.step_cost_with_lag(t, &beside, 1).unwrap());
        ((e + beside.tokens) / c, c / e)
    };
    let drafting = a.trees[1..].iter().map(|(_, t)| rates(t)).max_by(|x, y| x.0.total_cmp(&y.0)).unwrap();
    let catch_up = a.draft.at(60).unwrap();
    let plain = rates(&a.trees[0].1);
    assert!(drafting.0 > plain.0, "drafting beats plain steps beside one member");
    let even = catch_up * plain.0 / (drafting.1 * (drafting.0 - plain.0));
    assert!(!a.catch_up_pays(60, even.floor() as usize, &beside));
    assert!(a.catch_up_pays(60, even.floor() as usize + 1, &beside));
    // The text's own saving per token (plain seconds per token less the drafting tree's)
    // reaches the catch-up's seconds well before: that rule would have caught up already.
    let own = catch_up / (plain.1 - drafting.1);
    assert!(own < even / 2.0, "alone-style break-even {own} against the batch's {even}");
    assert!(!a.catch_up_pays(60, own.ceil() as usize + 1, &beside));
    // Alone, the rule is the text's own seconds saved: `a_catch_up_runs_when_drafting_the_rest_pays`
    // checks that break-even on the same costs and acceptance.
}

/// Before a text has tried drafts, a catch-up is weighed with the acceptance of the last text
/// that tried some (drafts all rejected there: no catch-up however long the answer; accepted:
/// catch up), and the text's own once it has tried drafts. A generation alone explores with a
/// lagging draft (after 16 plain steps) only while no text has tried drafts.
#[test]
fn a_catch_up_expects_the_last_text_s_acceptance() {
    let mut a = AutoTree::new(false);
    compute_bound_costs(&mut a);
    assert!(!a.explores_lagging());
    for _ in 0..16 {
        a.choose_without_drafts();
    }
    assert!(a.explores_lagging(), "no acceptance known: explore after 16 plain steps");
    assert!(a.catch_up_pays(60, 10_000, &SharedLoad::NONE), "the prior's 0.6");
    for _ in 0..100 {
        a.record_node(1, None);
    }
    a.new_text();
    assert!(!a.catch_up_pays(60, 10_000, &SharedLoad::NONE), "the last text rejected every draft");
    for _ in 0..16 {
        a.choose_without_drafts();
    }
    assert!(!a.explores_lagging(), "a text has tried drafts: no exploring catch-up");
    for _ in 0..100 {
        a.record_node(1, Some(0));
    }
    assert!(a.catch_up_pays(60, 10_000, &SharedLoad::NONE), "this text's own acceptance");
    a.new_text();
    assert!(a.catch_up_pays(60, 10_000, &SharedLoad::NONE), "the last text accepted every draft");
}

/// With multi-draft candidates, second drafts are drafted only when they are accepted:
/// cheap target rows and a cheap draft, first drafts accepted at 0.7; second drafts never
/// accepted give a tree without second drafts, second drafts accepted at 0.6 one with them.
#[test]
fn second_drafts_follow_their_own_acceptance() {
    let costs = |a: &mut AutoTree| {
        for r in 1..=16 {
            a.target.record(r, 0.020 + 0.0005 * (r - 1) as f64);
        }
        for r in 1..=9 {
            a.draft.record(r, 0.005 + 0.0005 * (r - 1) as f64);
        }
    };
    let second_drafts = |a: &AutoTree, i: usize| a.trees[i].1.branches();
    let mut never = AutoTree::new(true);
    costs(&mut never);
    for i in 0..200 {
        // Single drafts and first drafts accepted at 0.7, second drafts never.
        never.record_node(1, (i % 10 < 7).then_some(0));
        if i % 10 < 7 {
            never.record_node(2, Some(0));
        } else {
            never.record_node(2, None);
        }
    }
    let pick = never.choose();
    assert!(!second_drafts(&never, pick), "{} at {:?}", never.trees[pick].0, never.alphas());
    let mut often = AutoTree::new(true);
    costs(&mut often);
    for i in 0..200 {
        often.record_node(1, (i % 10 < 7).then_some(0));
        match i % 10 {
            0..7 => often.record_node(2, Some(0)),
            7 | 8 => often.record_node(2, Some(1)),
            _ => often.record_node(2, None),
        }
    }
    let pick = often.choose();
    assert!(second_drafts(&often, pick), "{} at {:?}", often.trees[pick].0, often.alphas());
}

/// A lookup of 5 rows pays alone where rows are cheap beside the first, not where each row
/// costs 40% of a one-row forward (this machine's AVX2 kernels), and in a full batch only
/// when it emits enough for everyone's wait.
#[test]
fn lookups_pay_only_when_their_rows_do() {
    let curve = |first: f64, per_row: f64| {
        let mut a = AutoTree::new(false);
        for r in 1..=40 {
            a.target.record(r, first + per_row * (r - 1) as f64);
        }
        a
    };
    let cheap_rows = curve(0.030, 0.001);
    let dear_rows = curve(0.030, 0.012);
    let alone = SharedLoad::NONE;
    assert!(cheap_rows.lookup_pays_in_batch(5, 1.5, &alone));
    assert!(!dear_rows.lookup_pays_in_batch(5, 1.5, &alone));
    // 5 rows at 0.078 s against one at 0.030 s: 2.6 tokens break even.
    assert!(dear_rows.lookup_pays_in_batch(5, 2.7, &alone));
    assert!(!dear_rows.lookup_pays_in_batch(5, 2.5, &alone));
    // Beside three plain members: (t + 3) / C(8) >= 4 / C(4).
    let three = SharedLoad { target_rows: 3, draft_rows: 0, tokens: 3.0 };
    let (c8, c4) = (0.030 + 0.012 * 7.0, 0.030 + 0.012 * 3.0);
    let even = 4.0 * c8 / c4 - 3.0;
    assert!(dear_rows.lookup_pays_in_batch(5, even + 0.05, &three));
    assert!(!dear_rows.lookup_pays_in_batch(5, even - 0.05, &three));
    // Unknown costs: take the lookup.
    assert!(AutoTree::new(false).lookup_pays_in_batch(5, 1.0, &three));
}

/// Generators sharing a book measure once: the second takes the first's costs and keeps
/// its own where it has them.
#[test]
fn a_cost_book_fills_what_a_curve_lacks() {
    let book = CostBook::new();
    {
        let mut costs = book.lock();
        costs.0.record(1, 0.03);
        costs.0.record(8, 0.1);
        costs.1.record(1, 0.01);
    }
    let mut a = AutoTree::new(false);
    a.target.record(8, 0.2);
    let costs = book.lock();
    a.target.fill_from(&costs.0);
    a.draft.fill_from(&costs.1);
    assert_eq!(a.target.at(1), Some(0.03));
    assert_eq!(a.target.at(8), Some(0.2), "its own measurement stays");
    assert_eq!(a.draft.at(1), Some(0.01));
    assert!(!a.target.has(4) && a.target.has(1));
}

/// A node at depth `d` scales its `α` by `factors[d]` (deeper nodes by the last), at most 1:
/// a chain's tokens are then `1 + a f0 + a f0 · a f1 + ...`.
#[test]
fn expected_tokens_scale_each_depth_s_acceptance() {
    let t = DraftTree::preset("chain-4").unwrap();
    let al = alphas(0.6, (0.1, 0.2), (0.3, 0.4, 0.5));
    let (a0, a1, a2) = (0.6, 0.6 * 0.5, 0.6 * 0.25);
    let want = 1.0 + a0 + a0 * a1 + a0 * a1 * a2 + a0 * a1 * a2 * a2;
    let got = AutoTree::expected_tokens_by_depth(&t, &al, &[1.0, 0.5, 0.25]);
    assert!((got - want).abs() < 1e-12, "{got} against {want}");
    assert_eq!(AutoTree::expected_tokens_by_depth(&t, &al, &[1.0; DEPTHS]), AutoTree::expected_tokens(&t, &al));
    // A factor above 1 cannot make a draft surer than certain.
    let sure = AutoTree::expected_tokens_by_depth(&t, &alphas(0.9, (0.1, 0.2), (0.3, 0.4, 0.5)), &[1.0, 2.0, 2.0]);
    assert!((sure - (1.0 + 0.9 * 4.0)).abs() < 1e-12, "{sure}");
}

/// Drafts from deeper nodes accepted less often than the root's (as the EAGLE head's are)
/// lower the deeper nodes' `α`, and the choice: accepted at 0.6 from the root and at 0.2
/// below it, a chain of one draft beats deeper ones that the root's acceptance alone would
/// pick. Until a depth has shown its own, it keeps the root's.
#[test]
fn deeper_drafts_follow_their_own_acceptance() {
    let costs = |a: &mut AutoTree| {
        for r in 1..=7 {
            a.target.record(r, 0.040 + 0.002 * (r - 1) as f64);
        }
        for r in 1..=7 {
            a.draft.record(r, 0.004);
        }
    };
    let (mut flat, mut deep) = (AutoTree::new(false), AutoTree::new(false));
    costs(&mut flat);
    costs(&mut deep);
    for i in 0..100 {
        for a in [&mut flat, &mut deep] {
            a.record_node_at(0, 1, (i % 10 < 6).then_some(0));
        }
        deep.record_node_at(1 + i % 2, 1, (i % 10 < 2).then_some(0));
    }
    assert_eq!(flat.depth_factors(), [1.0; DEPTHS], "no deeper drafts seen");
    // The first draft's acceptance at each depth: the pooled estimate times the depth's factor.
    let at = |a: &AutoTree, d: usize| a.alphas()[0][0] * a.depth_factors()[d];
    assert!((at(&flat, 0) - 0.6).abs() < 0.03, "{}", at(&flat, 0));
    assert!((at(&deep, 0) - 0.6).abs() < 0.03, "{}", at(&deep, 0));
    for d in 1..DEPTHS {
        assert!((at(&deep, d) - 0.2).abs() < 0.03, "depth {d}: {}", at(&deep, d));
    }
    let flat_pick = flat.choose();
    let deep_pick = deep.choose();
    assert_ne!(flat.trees[flat_pick].0, "chain-1", "alpha {:?}", flat.alphas());
    assert_ne!(flat.trees[flat_pick].0, "no-drafts");
    assert_eq!(deep.trees[deep_pick].0, "chain-1", "alpha {:?}, depths {:?}", deep.alphas(), deep.depth_factors());
    // A new text starts again from the root's acceptance at every depth; a catch-up before it
    // drafts expects the last text's (`catch_up_pays` reads both).
    deep.new_text();
    assert_eq!(deep.depth_factors(), [1.0; DEPTHS]);
    let (alphas, factors) = deep.expected_alphas();
    assert!(alphas[0][0] * factors[1] < 0.3, "{alphas:?} {factors:?}");
}
