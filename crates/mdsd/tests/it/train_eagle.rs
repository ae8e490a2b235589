//! `mdsd train-eagle` end to end on a tiny random target with a chat template and tiny prompt
//! sets: every stage runs, the head loads in `generate --eagle` and its drafts keep the answer
//! exact; run again, the command resumes (nothing recomputed, more epochs trained); bad input
//! gets clear errors.

use crate::cli::{fails, generate_greedy_json, s};
use crate::common::{mdsd, mdsd_with, temp_dir, Tiny};
use candle_core::quantized::GgmlDType;
use std::path::PathBuf;

fn write_data(dir: &std::path::Path) {
    let w = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
    let words = ["ABC", "DEF", "GHI", "JKL", "MNO", "PQR"];
    let alpaca: String = (0..6)
        .map(|i| {
            format!(
                "{{\"instruction\":\"{}\",\"input\":\"\",\"output\":\"{} {}\"}}\n",
                words[i],
                words[(i + 1) % 6],
                words[(i + 2) % 6]
            )
        })
        .collect();
    w("alpaca_sample.jsonl", alpaca);
    w("cnndm_frank_test.jsonl", "{\"article\":\"ABC DEF GHI\",\"highlights_tokenized\":\"DEF GHI .\"}\n".into());
    w("wmt14_deen_test.jsonl", "{\"de\":\"ABC\",\"en\":\"DEF\"}\n".into());
    w(
        "spec_bench_question.jsonl",
        "{\"category\":\"qa\",\"turns\":[\"GHI\"]}\n{\"category\":\"writing\",\"turns\":[\"JKL\"]}\n\
         {\"category\":\"qa\",\"turns\":[\"DEF GHI\"]}\n"
            .into(),
    );
    w("eagle_alpaca_question.jsonl", "{\"category\":\"alpaca\",\"turns\":[\"MNO\"]}\n".into());
    w(
        "mt_bench_question.jsonl",
        "{\"category\":\"writing\",\"turns\":[\"PQR\",\"x\"]}\n{\"category\":\"coding\",\"turns\":[\"ABC\"]}\n".into(),
    );
}

/// `train-eagle`'s flags for a run of seconds on the tiny target and data.
const TINY_RUN: &[&str] = &[
    "--batch-rows",
    "16",
    "--self-answer-tokens",
    "6",
    "--eval-answer-tokens",
    "6",
    "--intermediate-size",
    "24",
    "--draft-vocab",
    "0",
    "--self-answers-per-category",
    "1",
];

/// A fresh folder `name` with a tiny chat target (`target.gguf`, weights of `seed`) and the tiny
/// prompt sets (`data/`): `(folder, target, data)`.
fn tiny_target_and_data(name: &str, seed: u64) -> (PathBuf, PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let target =
        Tiny { scale: 0.8, ..Tiny::chat_llama(seed) }.write_gguf(&dir.join("target.gguf"), GgmlDType::F32, &[]);
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_data(&data);
    (dir, target, data)
}

#[test]
fn train_eagle_writes_a_head_that_generate_loads_and_resumes() {
    let (dir, target, data) = tiny_target_and_data("cli-train-eagle", 47);
    let out = dir.join("run");
    let run_in = |out: &std::path::Path, epochs: &str, extra: &[&str]| {
        let mut args = vec![
            "train-eagle",
            "--target",
            s(&target),
            "--out",
            s(out),
            "--data",
            s(&data),
            "--epochs",
            epochs,
            "--lr",
            "1e-3",
        ];
        args.extend_from_slice(TINY_RUN);
        args.extend_from_slice(extra);
        // A line of progress at every step (60 s apart by default).
        let o = mdsd_with(&args, &[("MDSD_PROGRESS_SECONDS", "0")]);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        err
    };
    let run = |epochs: &str| run_in(&out, epochs, &[]);
    let first = run("1");
    assert!(first.contains("wrote") && first.contains("head"), "{first}");
    // The evaluations are printed with no terminal too (indicatif drops a hidden bar's lines).
    assert!(first.contains("epoch 1: eval loss") && first.contains("stopped after"), "{first}");
    // So is each stage's progress, which a bar would show on a terminal.
    for stage in ["target answers -> ", "features -> ", "training, epoch 1 of 1: "] {
        let lines: Vec<&str> = first.lines().filter(|l| l.starts_with(&format!("mdsd: {stage}"))).collect();
        let estimated = lines.iter().filter(|l| l.contains("%), ") && l.contains(" so far, about ")).count();
        let unknown = lines.iter().filter(|l| l.contains(" so far, the time left not yet known")).count();
        assert!(estimated > 0 && estimated + unknown == lines.len(), "{stage:?} lines: {first}");
    }
    // MT-Bench's categories are never trained on: one Spec-Bench self answer (qa), one Alpaca.
    let answers = std::fs::read_to_string(out.join("self_answers.jsonl")).unwrap();
    assert_eq!(answers.lines().count(), 2, "{answers}");
    assert!(!answers.contains("JKL"), "{answers}");
    assert_eq!(std::fs::read_to_string(out.join("eval_answers.jsonl")).unwrap().lines().count(), 2);
    // The answers were generated together (the default --answer-batch 8, here 2 at once) and
    // are, in order, those generated one at a time.
    let alone = dir.join("alone");
    run_in(&alone, "1", &["--answer-batch", "1", "--max-steps", "1"]);
    for f in ["self_answers.jsonl", "eval_answers.jsonl"] {
        let read = |d: &std::path::Path| std::fs::read_to_string(d.join(f)).unwrap();
        assert_eq!(read(&alone), read(&out), "{f}");
        // And each is `generate`'s greedy answer to its prompt.
        let lines: Vec<serde_json::Value> = read(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_ne!(lines[0]["answer"], lines[1]["answer"], "{f}: two prompts, two answers");
        for line in &lines {
            let prompt = line["prompt"].as_str().unwrap();
            let plain = generate_greedy_json(&target, prompt, "6", &["--no-spec", "--chat"]);
            assert_eq!(plain["text"], line["answer"], "{f}: {prompt}");
        }
    }
    let stored = |f: &str| std::fs::read_to_string(out.join(f).join("sequences.jsonl")).unwrap().lines().count();
    let (train, eval) = (stored("features"), stored("eval_features"));
    assert_eq!((train, eval), (10, 2), "6 Alpaca + 1 CNN/DM + 1 WMT + 2 self answers; 2 evaluation answers");
    let log = std::fs::read_to_string(out.join("train_log.jsonl")).unwrap();
    assert!(log.contains("\"split\":\"eval\"") && log.contains("\"split\":\"validation\""), "{log}");
    let steps = |log: &str| log.lines().filter(|l| l.contains("\"event\":\"step\"")).count();
    let steps_one = steps(&log);
    assert!(steps_one > 0);

    // Run again with more epochs: the answers and features are kept, training goes on.
    let modified = std::fs::metadata(out.join("features/hidden.f16")).unwrap().modified().unwrap();
    run("2");
    assert_eq!(std::fs::metadata(out.join("features/hidden.f16")).unwrap().modified().unwrap(), modified);
    assert_eq!(stored("features"), train);
    let log = std::fs::read_to_string(out.join("train_log.jsonl")).unwrap();
    assert_eq!(steps(&log), 2 * steps_one, "the second epoch only");

    // The head drafts in `generate --eagle`, and the greedy answer is the plain one.
    let head = out.join("head");
    let plain = generate_greedy_json(&target, "ABC", "12", &["--no-spec", "--ignore-eos"]);
    let drafted =
        generate_greedy_json(&target, "ABC", "12", &["--eagle", s(&head), "--tree", "chain-3", "--ignore-eos"]);
    assert_eq!(plain["text"], drafted["text"]);
    assert!(drafted["draft_forwards"].as_u64().unwrap() > 0, "{drafted}");

    // A second run on a folder in use is refused (this process holds the run's lock), and
    // runs once the lock is released.
    let lock = std::fs::File::open(out.join(".lock")).unwrap();
    lock.lock().unwrap();
    let e = fails(&["train-eagle", "--target", s(&target), "--out", s(&out), "--data", s(&data)]);
    assert!(e.contains("another train-eagle run") && e.contains(".lock"), "{e}");
    drop(lock);
    run("2");

    // --self-answers-alpaca-sample asks the Alpaca sample's instructions after the other
    // prompts, and --self-answers-more-per-category the next Spec-Bench prompts of each category
    // after those: a folder holding the answers to the others keeps them (here marked) and adds
    // these.
    let more = dir.join("more");
    std::fs::create_dir_all(&more).unwrap();
    let kept = std::fs::read_to_string(out.join("self_answers.jsonl")).unwrap();
    let mut first: serde_json::Value = serde_json::from_str(kept.lines().next().unwrap()).unwrap();
    first["answer"] = "KEPT".into();
    let marked = format!("{first}\n{}\n", kept.lines().nth(1).unwrap());
    std::fs::write(more.join("self_answers.jsonl"), &marked).unwrap();
    run_in(
        &more,
        "1",
        &["--self-answers-alpaca-sample", "2", "--self-answers-more-per-category", "1", "--max-steps", "1"],
    );
    let grown = std::fs::read_to_string(more.join("self_answers.jsonl")).unwrap();
    let parse =
        |text: &str| -> Vec<serde_json::Value> { text.lines().map(|l| serde_json::from_str(l).unwrap()).collect() };
    let all = parse(&grown);
    let (kept, added) = all.split_at(2);
    assert_eq!(kept, parse(&marked).as_slice(), "{grown}");
    assert_eq!(added.len(), 3, "{grown}");
    let sources = ["self/alpaca_sample", "self/alpaca_sample", "self/spec_bench/qa"];
    for ((line, prompt), source) in added.iter().zip(["ABC", "DEF", "DEF GHI"]).zip(sources) {
        assert_eq!((line["source"].as_str(), line["prompt"].as_str()), (Some(source), Some(prompt)));
        let plain = generate_greedy_json(&target, prompt, "6", &["--no-spec", "--chat"]);
        assert_eq!(plain["text"], line["answer"], "{prompt}");
    }
    let in_more = std::fs::read_to_string(more.join("features/sequences.jsonl")).unwrap().lines().count();
    assert_eq!(in_more, train + 3, "three more texts");

    // --init-head continues from a head: before its first step it scores the evaluation set as
    // the run that wrote the head (in f32) scored it last; --unroll 2 trains two steps deep and
    // logs top-1 per depth (3 depths in evaluations).
    let f32_run = dir.join("f32");
    run_in(&f32_run, "1", &["--dtype", "f32"]);
    let evals = |d: &std::path::Path| -> Vec<serde_json::Value> {
        let log = std::fs::read_to_string(d.join("train_log.jsonl")).unwrap();
        log.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["split"] == "eval")
            .collect()
    };
    let written = evals(&f32_run).pop().unwrap();
    let continued = dir.join("continued");
    let init = f32_run.join("head");
    let said = run_in(&continued, "1", &["--init-head", s(&init), "--unroll", "2"]);
    assert!(said.contains("before training: eval") && said.contains("per depth"), "{said}");
    let first_eval = &evals(&continued)[0];
    assert_eq!(first_eval["step"], 0, "{first_eval}");
    for k in ["acc", "acc_full", "regression", "token", "acc_steps", "rows"] {
        assert_eq!(first_eval["scores"][k], written["scores"][k], "{k}: {first_eval} against {written}");
    }
    assert_eq!(first_eval["scores"]["acc_steps"].as_array().unwrap().len(), 3);
    let log = std::fs::read_to_string(continued.join("train_log.jsonl")).unwrap();
    let step: serde_json::Value =
        serde_json::from_str(log.lines().find(|l| l.contains("\"event\":\"step\"")).unwrap()).unwrap();
    assert_eq!(step["scores"]["acc_steps"].as_array().unwrap().len(), 2, "{step}");
    // A head of other sizes is refused, by name.
    let other = dir.join("other-width");
    let e = fails(&[
        "train-eagle",
        "--target",
        s(&target),
        "--out",
        s(&other),
        "--data",
        s(&data),
        "--self-answer-tokens",
        "6",
        "--eval-answer-tokens",
        "6",
        "--draft-vocab",
        "0",
        "--init-head",
        s(&init),
        "--intermediate-size",
        "16",
    ]);
    assert!(e.contains("--init-head") && e.contains("f32/head"), "{e}");

    // --reuse reads a finished folder beside other readers (a shared lock, here held by this
    // process) and writes nothing there; a run writing that folder is refused meanwhile.
    let reader = std::fs::File::open(out.join(".lock")).unwrap();
    reader.lock_shared().unwrap();
    let stamp = |p: std::path::PathBuf| std::fs::metadata(p).unwrap().modified().unwrap();
    let before = [stamp(out.join("features/sequences.jsonl")), stamp(out.join("self_answers.jsonl"))];
    let reused = dir.join("reused");
    let said = run_in(&reused, "1", &["--reuse", s(&out), "--init-head", s(&out.join("head")), "--max-steps", "1"]);
    assert!(said.contains("wrote"), "{said}");
    assert!(!reused.join("features").exists() && !reused.join("self_answers.jsonl").exists());
    let after = [stamp(out.join("features/sequences.jsonl")), stamp(out.join("self_answers.jsonl"))];
    assert_eq!(after, before, "--reuse wrote in the folder it reads");
    let e = fails(&["train-eagle", "--target", s(&target), "--out", s(&out), "--data", s(&data)]);
    assert!(e.contains("another train-eagle run is using"), "{e}");
    drop(reader);
    // And a run writing the folder keeps --reuse out.
    let writer = std::fs::File::open(out.join(".lock")).unwrap();
    writer.lock().unwrap();
    let e = fails(&[
        "train-eagle",
        "--target",
        s(&target),
        "--out",
        s(&dir.join("y")),
        "--data",
        s(&data),
        "--reuse",
        s(&out),
    ]);
    assert!(e.contains("another train-eagle run is writing"), "{e}");
    drop(writer);

    // --reuse: its own --out, a folder without a run's data.
    let e = fails(&["train-eagle", "--target", s(&target), "--out", s(&out), "--data", s(&data), "--reuse", s(&out)]);
    assert!(e.contains("--reuse") && e.contains("is --out"), "{e}");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = fails(&[
        "train-eagle",
        "--target",
        s(&target),
        "--out",
        s(&dir.join("x")),
        "--data",
        s(&data),
        "--reuse",
        s(&empty),
    ]);
    assert!(e.contains("empty/self_answers.jsonl") && e.contains("holds 0 of the 3 answers"), "{e}");
    // Clear errors: a missing data folder, answers of other prompts, a GPU in a CPU build.
    let e =
        fails(&["train-eagle", "--target", s(&target), "--out", s(&dir.join("other")), "--data", s(&dir.join("none"))]);
    assert!(e.contains("spec_bench_question.jsonl"), "{e}");
    if !cfg!(feature = "cuda") {
        let other = dir.join("other");
        let e =
            fails(&["train-eagle", "--target", s(&target), "--out", s(&other), "--data", s(&data), "--device", "cuda"]);
        assert!(e.contains("no CUDA support"), "{e}");
    }
    std::fs::write(data.join("spec_bench_question.jsonl"), "{\"category\":\"qa\",\"turns\":[\"DEF\"]}\n").unwrap();
    let e = fails(&[
        "train-eagle",
        "--target",
        s(&target),
        "--out",
        s(&out),
        "--data",
        s(&data),
        "--self-answer-tokens",
        "6",
    ]);
    assert!(e.contains("self_answers.jsonl") && e.contains("other prompts"), "{e}");
}

/// `mdsd fetch` of a pair whose head is trained here by a two-stage recipe (`then`): the first
/// stage writes `head/`, the second trains it further into `refined/head` on the first's answers
/// and features (`--reuse`: none computed again), the pair's draft is the refined head, and
/// `generate --pair` drafts with it, its greedy text the plain one. A second fetch trains nothing.
#[test]
fn fetch_trains_a_two_stage_recipe() {
    let dir = temp_dir("fetch-two-stage");
    let (cache, models, data) = (dir.join("cache"), dir.join("models"), dir.join("data"));
    for d in [&cache, &models, &data] {
        std::fs::create_dir_all(d).unwrap();
    }
    write_data(&data);
    let target = Tiny { scale: 0.8, ..Tiny::chat_llama(48) }.write_gguf(&cache.join("t.gguf"), GgmlDType::F32, &[]);
    let flags = format!(
        r#""--data", "{}", "--batch-rows", "16", "--self-answer-tokens", "6", "--eval-answer-tokens", "6", "--draft-vocab", "0""#,
        data.display()
    );
    std::fs::write(
        models.join("tiny-eagle.toml"),
        format!(
            "name = \"tiny-eagle\"\n[target]\nhub_repo = \"x/t\"\nfile = \"t.gguf\"\n[draft]\nkind = \"eagle-head\"\n\
             train_eagle = {{ args = [{flags}, \"--intermediate-size\", \"24\", \"--epochs\", \"1\", \"--lr\", \"1e-3\"], \
             then = [{flags}, \"--unroll\", \"2\", \"--epochs\", \"1\", \"--lr\", \"3e-4\"], hours = 0.01, measured_on = \"a test\" }}\n"
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mdsd"))
            .args(args)
            .args(["--models-dir", s(&models)])
            .env("MDSD_OFFLINE", "1")
            .env("MDSD_CACHE", &cache)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{args:?}: {stderr}");
        (stdout.to_string(), stderr.to_string())
    };
    let (stdout, stderr) = run(&["fetch", "tiny-eagle"]);
    let trained = cache.join("trained/tiny-eagle");
    assert!(stderr.contains("then `--data"), "{stderr}");
    assert!(stdout.contains(&format!("draft: {}", trained.join("refined/head").display())), "{stdout}");
    assert!(trained.join("head/model.safetensors").is_file() && trained.join("features").is_dir());
    let refined = trained.join("refined");
    assert!(!refined.join("features").exists() && !refined.join("self_answers.jsonl").exists());
    let log = std::fs::read_to_string(refined.join("train_log.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!((first["event"].as_str(), first["step"].as_u64()), (Some("eval"), Some(0)), "{first}");
    assert!(log.contains("\"acc_steps\":["), "{log}");
    let (_, again) = run(&["fetch", "tiny-eagle"]);
    assert!(!again.contains("trained here"), "{again}");

    let plain = generate_greedy_json(&target, "ABC", "10", &["--no-spec", "--ignore-eos"]);
    let (stdout, _) = run(&[
        "generate",
        "--pair",
        "tiny-eagle",
        "--prompt",
        "ABC",
        "--max-new-tokens",
        "10",
        "--json",
        "--temperature",
        "0",
        "--tree",
        "chain-3",
        "--ignore-eos",
    ]);
    let drafted: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(plain["text"], drafted["text"]);
    assert!(drafted["draft_forwards"].as_u64().unwrap() > 0, "{drafted}");
}

/// `--self-answer-samples 2`: two more answers to every self-answer prompt, sampled at the
/// given temperature, kept in their own file prompt by prompt: generated together they
/// equal those generated one at a time (each answer's seed is its own), each is `generate
/// --no-spec`'s sample with that seed, they are not the greedy answers, and all are trained on.
#[test]
fn train_eagle_samples_more_answers_each_with_its_own_seed() {
    let (dir, target, data) = tiny_target_and_data("cli-train-eagle-sampled", 49);
    let command = |out: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["train-eagle", "--target", s(&target), "--out", s(out), "--data", s(&data)];
        args.extend_from_slice(&["--epochs", "1", "--max-steps", "1"]);
        args.extend_from_slice(TINY_RUN);
        args.extend_from_slice(&["--self-answer-samples", "2"]);
        args.extend_from_slice(&["--self-answer-temperature", "0.9"]);
        args.extend_from_slice(extra);
        mdsd(&args)
    };
    let run_in = |out: &std::path::Path, extra: &[&str]| {
        let o = command(out, extra);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        err
    };
    let (together, alone) = (dir.join("together"), dir.join("alone"));
    let said = run_in(&together, &[]);
    let said_alone = run_in(&alone, &["--answer-batch", "1"]);
    let read = |d: &std::path::Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap();
    let file = "sampled_answers_t0.9.jsonl";
    assert_eq!(read(&together, file), read(&alone, file));
    let parse =
        |text: String| -> Vec<serde_json::Value> { text.lines().map(|l| serde_json::from_str(l).unwrap()).collect() };
    let (greedy, sampled) = (parse(read(&together, "self_answers.jsonl")), parse(read(&together, file)));
    assert_eq!((greedy.len(), sampled.len()), (2, 4));
    assert!(greedy.iter().all(|line| line.get("seed").is_none()), "a greedy answer has no seed: {greedy:?}");
    let mut differ = 0;
    for (k, line) in sampled.iter().enumerate() {
        // Prompt by prompt.
        let (sample, i) = (k % 2, k / 2);
        let twin = &greedy[i];
        assert_eq!(line["prompt"], twin["prompt"], "{line}");
        assert_eq!(line["source"].as_str().unwrap(), format!("sampled/{}", twin["source"].as_str().unwrap()));
        let seed = ((sample as u64) + 1) << 32 | i as u64;
        assert_eq!(line["seed"].as_u64(), Some(seed), "each sampled line keeps its seed: {line}");
        let seed = seed.to_string();
        let prompt = line["prompt"].as_str().unwrap();
        let args = ["generate", "--target", s(&target), "--prompt", prompt, "--max-new-tokens", "6", "--json"];
        let o = mdsd(&[&args[..], &["--chat", "--no-spec", "--temperature", "0.9", "--seed", &seed]].concat());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let plain: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(plain["text"], line["answer"], "sample {sample} of {prompt}");
        differ += usize::from(line["answer"] != twin["answer"]);
    }
    assert!(differ > 0, "every sampled answer is the greedy one: {sampled:?}");
    let stored = std::fs::read_to_string(together.join("features/sequences.jsonl")).unwrap().lines().count();
    assert_eq!(stored, 8 + 2 + 4, "6 Alpaca + 1 CNN/DM + 1 WMT, 2 greedy and 4 sampled answers");
    features_group_a_prompts_answers(&together, &said);
    features_of_the_earlier_order_resume_in_it(&together, &dir, |out| command(out, &[]));
    answers_of_the_earlier_order_resume_in_it(&together, &dir, |out| command(out, &[]));

    // A prompt's samples ran it once: alone (one generation, in the file's order), the second
    // sample of each prompt kept all its prompt but the pending token, and the second prompt
    // kept what it shares with the first (the chat template's system turn).
    let seqs = stored_sequences(&together);
    let (p0, p1) = (&seqs[8].0[..seqs[8].1], &seqs[11].0[..seqs[11].1]);
    let shared = p0.iter().zip(p1).take_while(|(a, b)| a == b).count();
    assert!(shared > 0 && shared < p0.len().min(p1.len()), "{p0:?} {p1:?}");
    let (all, kept) = (2 * (p0.len() + p1.len()), (p0.len() - 1) + shared + (p1.len() - 1));
    let line = format!("{file}: 4 answers; the target ran {} of their prompts' {all} tokens", all - kept);
    assert!(said_alone.contains(&line), "{line}: {said_alone}");
    let e = fails(&[
        "train-eagle",
        "--target",
        s(&target),
        "--out",
        s(&dir.join("zero")),
        "--data",
        s(&data),
        "--self-answer-temperature",
        "0",
    ]);
    assert!(e.contains("--self-answer-temperature"), "{e}");
}

/// A store's index: each sequence's tokens and answer start.
fn stored_sequences(run: &std::path::Path) -> Vec<(Vec<u32>, usize)> {
    let index = std::fs::read_to_string(run.join("features/sequences.jsonl")).unwrap();
    let parse = |l: &str| -> (Vec<u32>, usize) {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let tokens = v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        (tokens, v["answer_start"].as_u64().unwrap() as usize)
    };
    index.lines().map(parse).collect()
}

/// `run`'s store (8 fixed texts, then 2 prompts with a greedy and 2 sampled answers each) holds
/// a prompt's three answers one after the other, and the target ran only the tokens a text
/// does not share with the one before it (as the run said): a sampled answer's whole prompt
/// was not run again.
fn features_group_a_prompts_answers(run: &std::path::Path, said: &str) {
    let seqs = stored_sequences(run);
    let prompt = |k: usize| &seqs[k].0[..seqs[k].1];
    for group in [8..11, 11..14] {
        assert!(group.clone().all(|k| prompt(k) == prompt(group.start)), "{group:?}: one prompt's answers");
    }
    assert_ne!(prompt(8), prompt(11));
    let (mut ran, mut after_its_prompt) = (seqs[0].0.len(), 0);
    for pair in seqs.windows(2) {
        let [(before, _), (tokens, answer_start)] = pair else { unreachable!() };
        let shared = before.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len() - 1);
        after_its_prompt += usize::from(shared >= *answer_start);
        ran += tokens.len() - shared;
    }
    assert_eq!(after_its_prompt, 4, "each sampled text follows a text of its prompt");
    let total: usize = seqs.iter().map(|s| s.0.len()).sum();
    let line = format!("features: the target ran {ran} of {total} tokens");
    assert!(said.contains(&line), "{line}: {said}");
}

/// A folder whose features were stored in the order of earlier versions (the greedy answers,
/// then the sampled ones sample by sample), cut off after 12 texts, resumes in that order: the
/// run says so, and its store holds `grouped`'s texts in that order with byte-equal rows. So
/// does a folder of one sample a prompt grown to two. A store in no such order is refused by
/// name.
fn features_of_the_earlier_order_resume_in_it(
    grouped: &std::path::Path,
    dir: &std::path::Path,
    run: impl Fn(&std::path::Path) -> std::process::Output,
) {
    // Grouped: 8 fixed, then (greedy, sample 1, sample 2) of prompt 0, then of prompt 1.
    let earlier = [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 9, 12, 10, 13];
    let seqs = stored_sequences(grouped);
    let rows = std::fs::read(grouped.join("features/hidden.f16")).unwrap();
    let row_bytes = rows.len() / seqs.iter().map(|s| s.0.len()).sum::<usize>();
    let first_rows: Vec<usize> = seqs.iter().scan(0, |at, s| Some(std::mem::replace(at, *at + s.0.len()))).collect();
    let in_order = |order: &[usize]| -> (String, Vec<u8>) {
        let (mut index, mut bytes) = (String::new(), Vec::new());
        for &k in order {
            let (tokens, answer_start) = &seqs[k];
            let first_row = bytes.len() / row_bytes;
            let line = serde_json::json!({"tokens": tokens, "answer_start": answer_start, "first_row": first_row});
            index += &format!("{line}\n");
            bytes.extend_from_slice(&rows[first_rows[k] * row_bytes..(first_rows[k] + tokens.len()) * row_bytes]);
        }
        (index, bytes)
    };
    let folder_with = |name: &str, order: &[usize]| {
        let out = dir.join(name);
        std::fs::create_dir_all(out.join("features")).unwrap();
        for f in ["self_answers.jsonl", "sampled_answers_t0.9.jsonl", "eval_answers.jsonl"] {
            std::fs::copy(grouped.join(f), out.join(f)).unwrap();
        }
        let (index, bytes) = in_order(order);
        std::fs::write(out.join("features/sequences.jsonl"), index).unwrap();
        std::fs::write(out.join("features/hidden.f16"), bytes).unwrap();
        out
    };
    // (Cut after 11, it would also be a folder of no samples grown to two, and resume so.)
    let out = folder_with("earlier", &earlier[..12]);
    let o = run(&out);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && said.contains("in the order of an earlier run"), "{said}");
    let (index, bytes) = in_order(&earlier);
    let lines =
        |text: &str| -> Vec<serde_json::Value> { text.lines().map(|l| serde_json::from_str(l).unwrap()).collect() };
    assert_eq!(lines(&std::fs::read_to_string(out.join("features/sequences.jsonl")).unwrap()), lines(&index));
    assert!(std::fs::read(out.join("features/hidden.f16")).unwrap() == bytes, "the resumed rows differ");
    // A folder of one sample a prompt, grown to two: the second samples after all the others.
    let grown = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 10, 13];
    let out = folder_with("grown", &grown[..12]);
    let o = run(&out);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && said.contains("in the order of an earlier run"), "{said}");
    let (index, bytes) = in_order(&grown);
    assert_eq!(lines(&std::fs::read_to_string(out.join("features/sequences.jsonl")).unwrap()), lines(&index));
    assert!(std::fs::read(out.join("features/hidden.f16")).unwrap() == bytes, "the grown rows differ");
    // A sampled answer before its greedy one: neither order.
    assert_ne!(seqs[8], seqs[9], "a sample equal to its greedy answer");
    let out = folder_with("other-order", &[0, 1, 2, 3, 4, 5, 6, 7, 9]);
    let o = run(&out);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && said.contains("other-order/features: its features are of other texts"), "{said}");
}

/// A folder whose sampled answers were written in the order of earlier versions (sample by
/// sample), cut off after 3 of the 4, resumes in that order: the run says so, its file holds
/// `grouped`'s answers in that order, and its features are `grouped`'s (texts and rows).
fn answers_of_the_earlier_order_resume_in_it(
    grouped: &std::path::Path,
    dir: &std::path::Path,
    run: impl Fn(&std::path::Path) -> std::process::Output,
) {
    let file = "sampled_answers_t0.9.jsonl";
    let lines: Vec<String> = std::fs::read_to_string(grouped.join(file)).unwrap().lines().map(String::from).collect();
    // Prompt by prompt: (prompt 0: samples 0, 1), (prompt 1: samples 0, 1).
    let earlier: Vec<&str> = [0, 2, 1, 3].iter().map(|&k| lines[k].as_str()).collect();
    let out = dir.join("earlier-answers");
    std::fs::create_dir_all(&out).unwrap();
    for f in ["self_answers.jsonl", "eval_answers.jsonl"] {
        std::fs::copy(grouped.join(f), out.join(f)).unwrap();
    }
    std::fs::write(out.join(file), earlier[..3].join("\n") + "\n").unwrap();
    let o = run(&out);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && said.contains("its answers in the order of an earlier run"), "{said}");
    assert_eq!(std::fs::read_to_string(out.join(file)).unwrap(), earlier.join("\n") + "\n");
    for f in ["features/sequences.jsonl", "features/hidden.f16"] {
        let read = |d: &std::path::Path| std::fs::read(d.join(f)).unwrap();
        assert!(read(&out) == read(grouped), "{f} differs");
    }
}
