//! `train-eagle`'s first stage: the target's own answers to a list of prompts, generated
//! several at once and kept in a file that a later run resumes.

use super::{other_data_advice, progress_line, say, ProgressLog};
use anyhow::{bail, Context};
use engine::decode::{GenerationConfig, Generator};
use engine::train::data::Conversation;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::Path;

/// One prompt the target answers: where it comes from, its text, and the seed of its answer
/// (drawn at [`AnswerSettings::temperature`]; unused when greedy).
pub(super) struct Ask {
    pub source: String,
    pub prompt: String,
    pub seed: u64,
}

/// How the target answers a list of [`Ask`]s.
#[derive(Clone, Copy)]
pub(super) struct AnswerSettings {
    pub max_tokens: usize,
    /// 0: greedy.
    pub temperature: f64,
    /// Generations at once.
    pub batch: usize,
}

/// The target's answers to `asks`, greedy or sampled (`how`), in the asks' order, kept in `file`
/// (one [`AnswerLine`] per line, in the asks' order, or in the first of `earlier_orders`
/// (each a permutation of `asks`' indices) that the file's lines follow, when an earlier run
/// wrote it so); answers already there are not generated again.
/// `how.batch` generations run at once, on threads of their own with their forwards batched
/// ([`crate::batched::in_order`]); a row's result does not depend on the rows beside it and
/// each answer draws from a generator seeded by its own ask, so every answer is the one it gets
/// alone, whatever the batch is. A generation keeps the prefix its prompt shares with the one
/// before it (asks of one prompt in a row go to one generation, which runs the prompt once;
/// the others share the chat template's system turn): the kept keys and values are the very
/// numbers a fresh prompt pass gives where the target computes a row the same in every batch
/// (the CPU's Q4_K/Q6_K kernels, f32 weights; [`Generator::set_prefix_reuse`]), so the answers
/// are too; elsewhere (a GPU, f16 weights) they may differ by rounding. The time it saves:
/// docs/results/README.md#const-train-prompt-sharing. A run's answers are written when all
/// are done (an interruption loses at most `how.batch` runs), and a failed one ends its run.
pub(super) fn answers(
    target: &engine::model::DecoderModel,
    tok: &engine::tokenizer::TextTokenizer,
    asks: &[Ask],
    earlier_orders: &[Vec<usize>],
    how: AnswerSettings,
    file: &Path,
    read_only: bool,
) -> anyhow::Result<Vec<Conversation>> {
    let mut lines: Vec<AnswerLine> = match std::fs::read_to_string(file) {
        Ok(text) => whole_lines(&text).with_context(|| format!("{}: not a file of answers", file.display()))?,
        Err(_) => Vec::new(),
    };
    lines.truncate(asks.len());
    let Some((order, earlier)) = file_order(&lines, asks, earlier_orders) else {
        bail!(
            "{}: its answers are to other prompts (or seeds) than these settings give (or to more samples of each: a folder's --self-answer-samples can grow, not shrink); {}",
            file.display(),
            other_data_advice(read_only)
        )
    };
    if earlier {
        eprintln!("mdsd: {} holds its answers in the order of an earlier run; kept", file.display());
    }
    // The file's lines (in `order`) put in the asks' order.
    let in_asks_order = |done: Vec<Conversation>| -> Vec<Conversation> {
        let mut ordered: Vec<Option<Conversation>> = vec![None; asks.len()];
        for (c, &k) in done.into_iter().zip(&order) {
            ordered[k] = Some(c);
        }
        ordered.into_iter().map(|c| c.expect("every ask answered")).collect()
    };
    if lines.len() == asks.len() {
        return Ok(in_asks_order(lines.into_iter().map(|l| l.conversation).collect()));
    }
    if read_only {
        bail!(
            "{}: holds {} of the {} answers these settings ask for (--reuse reads a finished run's folder)",
            file.display(),
            lines.len(),
            asks.len()
        );
    }
    // Written again without a line cut short by an interruption (the file's seeds kept).
    let kept: String = lines.iter().map(|l| serde_json::to_string(l).expect("JSON of a value") + "\n").collect();
    std::fs::write(file, kept).with_context(|| format!("writing {}", file.display()))?;
    let mut done: Vec<Conversation> = lines.into_iter().map(|l| l.conversation).collect();
    let mut out = std::fs::OpenOptions::new().append(true).open(file)?;
    let bar = ProgressBar::new(asks.len() as u64).with_style(
        ProgressStyle::with_template("{spinner} target answers -> {msg} [{bar:30}] {pos}/{len}, {eta} left")
            .expect("a valid template"),
    );
    bar.set_message(file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default());
    bar.set_position(done.len() as u64);
    bar.reset_eta();
    let progress = ProgressLog::new();
    let what = format!("target answers -> {}", file.display());
    let capacity = target.config().context_length.min(4096);
    let config = GenerationConfig {
        max_new_tokens: how.max_tokens,
        warp: samplers::dist::Warp::temperature(how.temperature),
        seed: 0,
        randomness: Default::default(),
        speculative: None,
    };
    let todo: Vec<&Ask> = order[done.len()..].iter().map(|&k| &asks[k]).collect();
    // Runs of asks with one prompt, each generated by one generation in turn.
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (k, ask) in todo.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if todo[run.start].prompt == ask.prompt => run.end = k + 1,
            _ => runs.push(k..k + 1),
        }
    }
    let workers = how.batch.clamp(1, runs.len());
    let mut generators = Vec::with_capacity(workers);
    for _ in 0..workers {
        let mut generator = Generator::new(target, None, capacity)?;
        generator.set_prefix_reuse(true);
        generators.push(generator);
    }
    // The prompts' tokens the target ran, of all of them.
    let mut prompts_ran = (0, 0);
    // Written in the file's order (a resumed run keeps the file's lines as a prefix).
    crate::batched::in_order(
        generators,
        &runs,
        |generator, run| -> Vec<anyhow::Result<Result<Answered, usize>>> {
            let mut answers = Vec::with_capacity(run.len());
            for ask in &todo[run.clone()] {
                let config = GenerationConfig { seed: ask.seed, ..config.clone() };
                answers.push(answer(generator, tok, &ask.prompt, &config, capacity));
                if answers.last().is_some_and(|a| a.is_err()) {
                    break;
                }
            }
            answers
        },
        |i, answers| {
            for (ask, answer) in todo[runs[i].clone()].iter().zip(answers) {
                let answer = match answer? {
                    Ok(Answered { text, prompt_tokens, reused_tokens }) => {
                        prompts_ran.0 += prompt_tokens - reused_tokens;
                        prompts_ran.1 += prompt_tokens;
                        text
                    }
                    Err(prompt_tokens) => {
                        say(
                            &bar,
                            format!("skipped a prompt of {prompt_tokens} tokens (over {capacity} with its answer)"),
                        );
                        String::new()
                    }
                };
                let conversation = Conversation { source: ask.source.clone(), prompt: ask.prompt.clone(), answer };
                let seed = (how.temperature > 0.0).then_some(ask.seed);
                let line = AnswerLine { conversation, seed };
                writeln!(out, "{}", serde_json::to_string(&line)?)?;
                out.flush()?;
                done.push(line.conversation);
                bar.inc(1);
                progress.tick(&bar, || progress_line(&what, &bar, "answers", 0));
            }
            Ok(())
        },
    )?;
    bar.finish_and_clear();
    eprintln!(
        "mdsd: {}: {} answers; the target ran {} of their prompts' {} tokens (the others were kept from the prompt before)",
        file.display(),
        todo.len(),
        prompts_ran.0,
        prompts_ran.1
    );
    Ok(in_asks_order(done))
}

/// A line of an answers file: the conversation and, for a sampled answer, the seed it was
/// drawn with (its [`Ask::seed`]). Files written before seeds were kept have none; their lines
/// are matched to asks by their prompts alone.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct AnswerLine {
    #[serde(flatten)]
    conversation: Conversation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
}

/// The lines of an answers file that were written whole: each ends in a newline, written after
/// its text, so a line an interruption cut short (whose text may still end in `}`, inside an
/// answer's code) is left out, to be answered again.
fn whole_lines(text: &str) -> serde_json::Result<Vec<AnswerLine>> {
    (text.split_inclusive('\n'))
        .filter(|l| l.ends_with('\n') && !l.trim().is_empty())
        .map(|l| serde_json::from_str(l.trim_end()))
        .collect()
}

/// The order of a file's lines (a permutation of `asks`' indices whose first `lines.len()` the
/// lines answer) and whether it is one of `earlier` (an earlier run's) rather than the asks'
/// own; `None` when the lines follow neither. A line answers an ask when their prompts are
/// equal and, where the line keeps its seed, their seeds too: asks of one prompt text (a
/// prompt's samples, or two prompts of the same text) are then told apart by their seeds, so
/// a sample is never taken for another and drawn again with a seed not its own.
fn file_order(lines: &[AnswerLine], asks: &[Ask], earlier: &[Vec<usize>]) -> Option<(Vec<usize>, bool)> {
    let answer = |line: &AnswerLine, ask: &Ask| {
        line.conversation.prompt == ask.prompt && line.seed.is_none_or(|seed| seed == ask.seed)
    };
    let follows =
        |order: &[usize]| order.len() == asks.len() && lines.iter().zip(order).all(|(line, &k)| answer(line, &asks[k]));
    let asked: Vec<usize> = (0..asks.len()).collect();
    if follows(&asked) {
        return Some((asked, false));
    }
    earlier.iter().find(|order| follows(order)).map(|order| (order.clone(), true))
}

/// One answer ([`answer`]) and what its prompt cost.
struct Answered {
    text: String,
    prompt_tokens: usize,
    /// The prompt's tokens kept from the generation before ([`Generator::set_prefix_reuse`]).
    reused_tokens: usize,
}

/// The answer to one prompt through the chat template, or `Err(prompt tokens)` when
/// the prompt and its longest answer do not fit in `capacity`.
fn answer(
    generator: &mut Generator,
    tok: &engine::tokenizer::TextTokenizer,
    prompt: &str,
    config: &GenerationConfig,
    capacity: usize,
) -> anyhow::Result<Result<Answered, usize>> {
    let ids = tok.encode(&tok.apply_chat_template(prompt, None)?)?;
    if ids.len() + config.max_new_tokens > capacity {
        return Ok(Err(ids.len()));
    }
    let (new, stats) = generator.generate(&ids, config, |id| tok.is_stop(id), |_| Ok(()))?;
    let text = tok.decode(&new)?;
    Ok(Ok(Answered { text, prompt_tokens: stats.prompt_tokens, reused_tokens: stats.reused_tokens }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(prompt: &str, seed: u64) -> Ask {
        Ask { source: "self/x".into(), prompt: prompt.into(), seed }
    }

    fn line(prompt: &str, seed: Option<u64>) -> AnswerLine {
        AnswerLine {
            conversation: Conversation { source: "self/x".into(), prompt: prompt.into(), answer: "a".into() },
            seed,
        }
    }

    /// Sample `s` of prompt `i`'s seed, as `train-eagle` gives it.
    fn seed(s: u64, i: u64) -> u64 {
        ((s + 1) << 32) | i
    }

    #[test]
    fn a_line_answers_the_ask_of_its_seed() {
        // Two prompts of one text, two samples each, asked prompt by prompt; an earlier run
        // asked them sample by sample (asks 0, 2, 1, 3).
        let asks = [(0, 0), (0, 1), (1, 0), (1, 1)].map(|(i, s)| ask("same", seed(s, i)));
        let earlier = vec![vec![0, 2, 1, 3]];
        let asked: Vec<usize> = (0..4).collect();
        // The earlier run's first two lines: the first samples of prompts 0 and 1. Their
        // prompts alone fit the asks' order too; their seeds do not.
        let lines = [line("same", Some(seed(0, 0))), line("same", Some(seed(0, 1)))];
        assert_eq!(file_order(&lines, &asks, &earlier), Some((vec![0, 2, 1, 3], true)));
        // A file of before (no seeds) is read by its prompts alone: the asks' order first.
        let old = [line("same", None), line("same", None)];
        assert_eq!(file_order(&old, &asks, &earlier), Some((asked.clone(), false)));
        // The asks' own order.
        let own = [seed(0, 0), seed(1, 0), seed(0, 1)].map(|s| line("same", Some(s)));
        assert_eq!(file_order(&own, &asks, &earlier), Some((asked.clone(), false)));
        assert_eq!(file_order(&[], &asks, &earlier), Some((asked, false)));
        // A seed of no ask where it stands, or another prompt: neither order.
        assert_eq!(file_order(&[line("same", Some(seed(1, 1)))], &asks, &earlier), None);
        assert_eq!(file_order(&[line("other", Some(seed(0, 0)))], &asks, &earlier), None);
    }

    #[test]
    fn a_line_cut_short_is_left_out_even_where_it_ends_in_a_brace() {
        let whole = serde_json::to_string(&line("p", Some(seed(0, 0)))).unwrap();
        let code = serde_json::to_string(&AnswerLine {
            conversation: Conversation { source: "s".into(), prompt: "q".into(), answer: "fn f() {}\nmore".into() },
            seed: None,
        })
        .unwrap();
        let cut = &code[..code.find("{}").unwrap() + 2];
        assert!(cut.ends_with('}'));
        let read = whole_lines(&format!("{whole}\n{cut}")).unwrap();
        assert_eq!(read.iter().map(|l| l.seed).collect::<Vec<_>>(), [Some(seed(0, 0))]);
        assert_eq!(whole_lines(&format!("{whole}\n{code}\n\n")).unwrap().len(), 2);
        // A whole line that is not an answer is an error, not a line to skip.
        assert!(whole_lines(&format!("{cut}\n{whole}\n")).is_err());
    }

    #[test]
    fn a_greedy_line_is_a_conversation_and_a_sampled_one_keeps_its_seed() {
        let greedy = line("p", None);
        let as_before = serde_json::to_string(&greedy.conversation).unwrap();
        assert_eq!(serde_json::to_string(&greedy).unwrap(), as_before);
        let read: AnswerLine = serde_json::from_str(&as_before).unwrap();
        assert_eq!((read.conversation, read.seed), (greedy.conversation, None));
        let sampled = serde_json::to_string(&line("p", Some(seed(2, 7)))).unwrap();
        assert!(sampled.ends_with(&format!(",\"seed\":{}}}", seed(2, 7))), "{sampled}");
        assert_eq!(serde_json::from_str::<AnswerLine>(&sampled).unwrap().seed, Some(seed(2, 7)));
    }
}
