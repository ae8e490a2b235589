//! What `/metrics` reports (with `/health`'s counts of the completion requests being answered
//! and waiting): totals over the server's life in Prometheus' text format (as vLLM's `/metrics`, with the
//! speculative-decoding counters that give τ and the acceptance per depth).

use engine::decode::Stats;
use std::fmt::Write;
use std::sync::Mutex;

/// The server's totals, shared by the connections and the generation threads.
#[derive(Default)]
pub(super) struct Load {
    totals: Mutex<Totals>,
}

/// What happened to a completion request.
#[derive(Clone, Copy)]
pub(super) enum Outcome {
    /// Checked and passed to the generator.
    Generated,
    /// Refused with a 4xx status after reading it (malformed, bad values, too long).
    Refused,
    /// Refused with 401: no valid API key.
    Unauthorized,
    /// Refused with 503: the queue was full.
    Busy,
}

impl Outcome {
    /// Every outcome, in the order of their counts in [`Totals::requests`].
    const ALL: [Outcome; 4] = [Outcome::Generated, Outcome::Refused, Outcome::Unauthorized, Outcome::Busy];

    /// The `outcome` label of `mdsd_requests_total`.
    fn label(self) -> &'static str {
        match self {
            Outcome::Generated => "generated",
            Outcome::Refused => "refused",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Busy => "busy",
        }
    }
}

#[derive(Default)]
struct Totals {
    /// Requests by outcome, indexed by `Outcome as usize`.
    requests: [u64; 4],
    choices: u64,
    prompt_tokens: u64,
    reused_tokens: u64,
    generation_tokens: u64,
    target_forwards: u64,
    target_rows: u64,
    draft_forwards: u64,
    ngram_steps: u64,
    undrafted_steps: u64,
    /// Steps that accepted at least `d` drafts, index `d - 1`.
    accepted_at_depth: Vec<u64>,
    prefill_s: f64,
    decode_s: f64,
    /// Answers ended early: their client went away or stopped reading, the server stopped.
    ended_by_client: u64,
    ended_by_shutdown: u64,
}

impl Load {
    fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count(&self, outcome: Outcome) {
        self.totals().requests[outcome as usize] += 1;
    }

    /// Counts an answer ended before its end: by its client (gone, or not reading) or by the
    /// server stopping.
    pub fn ended(&self, by_shutdown: bool) {
        let mut t = self.totals();
        if by_shutdown {
            t.ended_by_shutdown += 1;
        } else {
            t.ended_by_client += 1;
        }
    }

    /// Adds a finished choice's statistics.
    pub fn add_choice(&self, s: &Stats) {
        let mut t = self.totals();
        t.choices += 1;
        t.prompt_tokens += s.prompt_tokens as u64;
        t.reused_tokens += s.reused_tokens as u64;
        t.generation_tokens += s.new_tokens as u64;
        t.target_forwards += s.target_forwards as u64;
        t.target_rows += s.target_rows as u64;
        t.draft_forwards += s.draft_forwards as u64;
        t.ngram_steps += s.ngram_steps as u64;
        t.undrafted_steps += s.undrafted_steps as u64;
        if t.accepted_at_depth.len() < s.accepted_at_depth.len() {
            t.accepted_at_depth.resize(s.accepted_at_depth.len(), 0);
        }
        for (total, &n) in t.accepted_at_depth.iter_mut().zip(&s.accepted_at_depth) {
            *total += n as u64;
        }
        t.prefill_s += s.prefill_s;
        t.decode_s += (s.total_s - s.prefill_s).max(0.0);
    }

    /// The `/metrics` text: Prometheus' exposition format, version 0.0.4, with the requests
    /// `running` and `waiting` now.
    pub fn prometheus(&self, running: usize, waiting: usize, batches: engine::model::BatchStats) -> String {
        let t = self.totals();
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(out, "# HELP mdsd_{name} {help}\n# TYPE mdsd_{name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "mdsd_{name}{labels} {value}");
            }
        };
        let one = |v: String| [(String::new(), v)];
        metric("requests_running", "gauge", "Completion requests being answered.", &one(running.to_string()));
        metric("requests_waiting", "gauge", "Completion requests queued.", &one(waiting.to_string()));
        let requests: Vec<_> = Outcome::ALL
            .iter()
            .map(|&o| (format!("{{outcome=\"{}\"}}", o.label()), t.requests[o as usize].to_string()))
            .collect();
        metric("requests_total", "counter", "Completion requests by outcome.", &requests);
        for (name, help, value) in [
            ("choices_total", "Choices generated to the end.", t.choices),
            ("prompt_tokens_total", "Prompt tokens of the finished choices.", t.prompt_tokens),
            ("reused_prompt_tokens_total", "Prompt tokens whose cached rows were reused.", t.reused_tokens),
            ("generation_tokens_total", "Tokens generated.", t.generation_tokens),
            ("target_forwards_total", "Target forwards after the prompts: one per step.", t.target_forwards),
            ("target_rows_total", "Rows the target ran after the prompts.", t.target_rows),
            ("draft_forwards_total", "Draft model or head forwards.", t.draft_forwards),
            ("ngram_steps_total", "Steps drafted by n-gram lookup.", t.ngram_steps),
            (
                "undrafted_steps_total",
                "Steps without drafts because their tree did not fit the context left.",
                t.undrafted_steps,
            ),
        ] {
            metric(name, "counter", help, &one(value.to_string()));
        }
        let depths: Vec<_> = t
            .accepted_at_depth
            .iter()
            .enumerate()
            .map(|(d, n)| (format!("{{depth=\"{}\"}}", d + 1), n.to_string()))
            .collect();
        metric(
            "steps_accepting_total",
            "counter",
            "Steps that accepted at least `depth` drafts (over target_forwards_total: the acceptance at that depth).",
            &depths,
        );
        metric(
            "answers_ended_total",
            "counter",
            "Answers ended early: their client went away or stopped reading, or the server stopped.",
            &[
                ("{reason=\"client\"}".into(), t.ended_by_client.to_string()),
                ("{reason=\"shutdown\"}".into(), t.ended_by_shutdown.to_string()),
            ],
        );
        for (name, help, value) in [
            ("batches_total", "Batched forwards (and logits products) of the running answers.", batches.batches),
            ("batch_requests_total", "Forwards and logits products the batches ran.", batches.requests),
            ("batch_rows_total", "Rows the batched forwards ran.", batches.rows),
        ] {
            metric(name, "counter", help, &one(value.to_string()));
        }
        metric(
            "batch_widest",
            "gauge",
            "The most sequences one batched forward held.",
            &one(batches.widest.to_string()),
        );
        metric("prefill_seconds_total", "counter", "Seconds in prompt passes.", &one(t.prefill_s.to_string()));
        metric("decode_seconds_total", "counter", "Seconds in decoding steps.", &one(t.decode_s.to_string()));
        out
    }
}
