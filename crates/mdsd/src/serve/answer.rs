//! Answering a checked request on its slot's generator: `n` choices for each of its prompts, one
//! after the other (choice `i`, counted over all prompts, with the seed `seed + i`; after a
//! prompt's first choice, its cached rows are reused), in one JSON object or streamed as
//! server-sent events. A client gone away (or the server shutting down past its grace period)
//! ends the generation at its next token.

use super::reply::{json_response, EventSink, Last, Reply};
use super::request::{Checked, Kind, Prompt};
use super::{logprobs, App};
use crate::report::message;
use engine::decode::logprobs::TokenLogprobs;
use engine::decode::stop::TextStops;
use engine::decode::{GenerationConfig, Generator, Stats};
use serde_json::{json, Value};
use std::cell::Cell;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// One request being answered: the server's shared state, its slot's generator, its number
/// (for its id) and the flag that ends it early (its client gone, the server stopping).
pub(super) struct Answering<'a> {
    pub(super) app: &'a App,
    pub(super) generator: &'a mut Generator<'static>,
    pub(super) number: u64,
    pub(super) cancel: &'a super::Cancel,
}

/// What one choice answers: the endpoint, the checked request, its prompt's tokens, the text
/// to echo before the answer, the path (for the log).
#[derive(Clone, Copy)]
struct Ask<'a> {
    kind: Kind,
    req: &'a Checked,
    ids: &'a [u32],
    echo: Option<&'a str>,
    path: &'a str,
}

/// How a streamed choice ended.
enum Streamed {
    Done(Box<Stats>),
    /// The client went away: nothing more is sent.
    Gone,
    /// Generation failed; the error event is sent.
    Failed,
}

impl Answering<'_> {
    /// Generates the request's choices and answers, streamed or in one object; returns the
    /// answer's end ([`Last`]) for the caller to send once the generator is back in the pool
    /// (errors and cancelled answers are sent, or dropped, here).
    pub(super) fn generate(
        &mut self,
        reply: Reply,
        kind: Kind,
        req: &Checked,
        prompts: &[Prompt],
        config: &GenerationConfig,
        path: &str,
    ) -> Option<Last> {
        let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, self.number);
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.generator.set_logprobs(req.logprobs);
        self.generator.set_logit_bias(req.logit_bias.clone());
        self.generator.set_penalties(req.penalties);
        // Every prompt's `n` choices, in order: the choice's index is its place in this list.
        let asks: Vec<(Ask, GenerationConfig)> = prompts
            .iter()
            .flat_map(|p| {
                let ask = Ask { kind, req, ids: &p.ids, echo: req.echo.then_some(p.text.as_str()), path };
                std::iter::repeat_n(ask, req.n)
            })
            .enumerate()
            .map(|(i, ask)| (ask, GenerationConfig { seed: config.seed.wrapping_add(i as u64), ..config.clone() }))
            .collect();
        let prompt_tokens: usize = prompts.iter().map(|p| p.ids.len()).sum();
        // The echoed prompt's records, from its first choice's prompt pass.
        let mut prompt_records: Option<Vec<TokenLogprobs>> = None;
        let mut done: Vec<(Stats, u64)> = Vec::with_capacity(asks.len());
        if !req.stream {
            let mut choices = Vec::with_capacity(asks.len());
            for (index, (ask, config)) in asks.iter().enumerate() {
                if index % req.n == 0 {
                    prompt_records = None;
                }
                match self.answer_whole(*ask, config, index, &mut prompt_records) {
                    Ok((choice, stats)) => {
                        choices.push(choice);
                        self.app.load.add_choice(&stats);
                        done.push((stats, config.seed));
                    }
                    Err(msg) => {
                        reply.error(500, &msg);
                        return None;
                    }
                }
                if self.cancel.is_set() {
                    // Nobody is left to answer.
                    return None;
                }
            }
            let body = json!({
                "id": id,
                "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
                "created": created,
                "model": self.app.model,
                "choices": choices,
                "usage": usage(prompt_tokens, &done),
                "mdsd": mdsd_stats(&done, self.app.show_reused_tokens),
            });
            return Some(Last::Whole(reply, json_response(200, &body)));
        }
        let writer = reply.stream();
        let model = self.app.model.clone();
        let mut events = Events { kind, index: 0, id: &id, created, model: &model, writer };
        // A write that fails (the client gone or not reading) ends the answer: nothing more is sent.
        match self.stream_choices(&asks, req, &mut events, &mut prompt_records, &mut done, prompt_tokens) {
            Ok(true) => Some(Last::Stream(events.writer)),
            _ => None,
        }
    }

    /// The streamed choices, one after the other; whether the stream is to end with `[DONE]`
    /// (not when the client went away).
    fn stream_choices(
        &mut self,
        asks: &[(Ask, GenerationConfig)],
        req: &Checked,
        events: &mut Events,
        prompt_records: &mut Option<Vec<TokenLogprobs>>,
        done: &mut Vec<(Stats, u64)>,
        prompt_tokens: usize,
    ) -> std::io::Result<bool> {
        for (index, (ask, config)) in asks.iter().enumerate() {
            events.index = index;
            if index % req.n == 0 {
                *prompt_records = None;
            }
            match self.answer_streamed(*ask, config, events, prompt_records)? {
                Streamed::Done(stats) => {
                    let stats = *stats;
                    self.app.load.add_choice(&stats);
                    let mut last = events.chunk(events.delta(String::new()), Some(finish_reason(&stats)), Value::Null);
                    done.push((stats, config.seed));
                    // The last event carries the request's usage and statistics.
                    if index + 1 == asks.len() {
                        last["usage"] = usage(prompt_tokens, done);
                        last["mdsd"] = mdsd_stats(done, self.app.show_reused_tokens);
                    }
                    events.raw(&last.to_string())?;
                }
                Streamed::Gone => return Ok(false),
                Streamed::Failed => break,
            }
        }
        Ok(true)
    }

    /// Sets whether this choice scores the echoed prompt, and returns its stop matcher.
    fn prepare(&mut self, ask: Ask, prompt_records: &Option<Vec<TokenLogprobs>>) -> TextStops<'static> {
        let req = ask.req;
        let session: &'static crate::session::Session = self.app.session;
        let tok = &session.target.tokenizer;
        let ignore_eos = req.ignore_eos || self.app.run.ignore_eos;
        // Only a prompt's first choice scores the echoed prompt; the others take its records.
        let score = ask.echo.is_some() && req.logprobs.is_some() && prompt_records.is_none();
        self.generator.set_prompt_logprobs(score);
        // The end of turn, else each token's text against the stop strings (checked already).
        TextStops::new(tok, req.stops.clone(), ignore_eos).expect("stop checked by complete")
    }

    /// One choice, whole: its `choices` entry and statistics, or the error's message.
    fn answer_whole(
        &mut self,
        ask: Ask,
        config: &GenerationConfig,
        index: usize,
        prompt_records: &mut Option<Vec<TokenLogprobs>>,
    ) -> Result<(Value, Stats), String> {
        let Ask { kind, req, ids, echo: echoed, path } = ask;
        let stops = self.prepare(ask, prompt_records);
        let session = self.app.session;
        let tok = &session.target.tokenizer;
        let cancel = self.cancel;
        let (out, mut stats) =
            self.generator.generate(ids, config, |t| cancel.is_set() || stops.is_stop(t), |_| Ok(())).map_err(|e| {
                let msg = message(&anyhow::Error::from(e));
                eprintln!("mdsd serve: POST {path}: {msg}");
                msg
            })?;
        if cancel.is_set() {
            stats.stop_reason = "client_gone".into();
            self.app.load.ended(cancel.by_server());
        } else if stops.stopped() {
            stats.stop_reason = "stop_string".into();
        }
        log(path, &stats);
        let echo = echoed.unwrap_or("");
        let answer = if req.stops.is_empty() {
            tok.decode(&out).map_err(|e| format!("decoding the answer: {e}"))?
        } else {
            stops.answer()
        };
        let text = format!("{echo}{answer}");
        let logprobs = match req.logprobs {
            Some(_) => {
                let records = &self.generator.logprobs()[..stops.tokens_shown(out.len(), true)];
                let answer = logprobs::format(kind, tok, &stops, records, 0, echo.chars().count());
                match echoed {
                    Some(_) => {
                        let prompt = prompt_records.get_or_insert_with(|| self.generator.prompt_logprobs().to_vec());
                        logprobs::with_prompt(tok, ids, echo, prompt, answer)
                    }
                    None => answer,
                }
            }
            None => Value::Null,
        };
        let reason = finish_reason(&stats);
        let choice = match kind {
            Kind::Text => json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}),
            Kind::Chat => json!({
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": reason,
            }),
        };
        Ok((choice, stats))
    }

    /// One choice, streamed: the role (chat), the echoed prompt, then the answer's pieces with
    /// their log-probabilities; not its finish event.
    fn answer_streamed(
        &mut self,
        ask: Ask,
        config: &GenerationConfig,
        events: &mut Events,
        prompt_records: &mut Option<Vec<TokenLogprobs>>,
    ) -> std::io::Result<Streamed> {
        let Ask { kind, req, ids, echo: echoed, path } = ask;
        let stops = self.prepare(ask, prompt_records);
        let session = self.app.session;
        let tok = &session.target.tokenizer;
        let cancel = self.cancel;
        if kind == Kind::Chat {
            events.send(json!({"role": "assistant", "content": ""}), Value::Null)?;
        }
        let echo = echoed.unwrap_or("");
        let mut gathered = logprobs::Gathered::new(echo.chars().count());
        // A streaming client that went away ends the generation at the next token (the caches
        // keep the text for the next request).
        let gone = Cell::new(false);
        // The echoed prompt goes first, with its log-probabilities once the prompt pass gave them.
        let mut echo_pending = echoed.is_some();
        let echo_event = |events: &mut Events, records: &[TokenLogprobs]| {
            let lp = match req.logprobs {
                Some(_) => {
                    logprobs::with_prompt(tok, ids, echo, records, logprobs::format(kind, tok, &stops, &[], 0, 0))
                }
                None => Value::Null,
            };
            events.send(events.delta(echo.to_string()), lp)
        };
        let known = prompt_records.clone();
        let result = self.generator.generate_emitting(
            ids,
            config,
            |t| gone.get() || cancel.is_set() || stops.is_stop(t),
            |e| {
                if std::mem::take(&mut echo_pending) {
                    let records = known.as_deref().unwrap_or(e.prompt_logprobs);
                    if echo_event(events, records).is_err() {
                        gone.set(true);
                    }
                }
                gathered.extend(e.logprobs);
                let piece = stops.ready(false);
                let lp = if req.logprobs.is_some() { gathered.next(kind, tok, &stops, false) } else { None };
                if piece.is_empty() && lp.is_none() {
                    return Ok(());
                }
                if events.send(events.delta(piece), lp.unwrap_or(Value::Null)).is_err() {
                    gone.set(true);
                }
                Ok(())
            },
        );
        match result {
            Ok((_, mut stats)) if gone.get() || cancel.is_set() => {
                stats.stop_reason = "client_gone".into();
                log(path, &stats);
                let by_server = !gone.get() && cancel.by_server();
                self.app.load.ended(by_server);
                let why = if by_server { "the server is stopping" } else { "the client went away or stopped reading" };
                eprintln!("mdsd serve: POST {path}: {why}; the answer ended there");
                Ok(Streamed::Gone)
            }
            Ok((_, mut stats)) => {
                if stops.stopped() {
                    stats.stop_reason = "stop_string".into();
                }
                log(path, &stats);
                if echoed.is_some() && req.logprobs.is_some() && prompt_records.is_none() {
                    *prompt_records = Some(self.generator.prompt_logprobs().to_vec());
                }
                if echo_pending {
                    echo_event(events, prompt_records.as_deref().unwrap_or(&[]))?;
                }
                let rest = stops.ready(true);
                let lp = if req.logprobs.is_some() { gathered.next(kind, tok, &stops, true) } else { None };
                if !rest.is_empty() || lp.is_some() {
                    events.send(events.delta(rest), lp.unwrap_or(Value::Null))?;
                }
                Ok(Streamed::Done(Box::new(stats)))
            }
            Err(e) => {
                // The status line is out: the error goes as an event.
                let msg = message(&anyhow::Error::from(e));
                eprintln!("mdsd serve: POST {path}: {msg}");
                events.raw(&json!({"error": {"message": msg, "type": "server_error", "code": 500}}).to_string())?;
                Ok(Streamed::Failed)
            }
        }
    }
}

fn log(path: &str, stats: &Stats) {
    eprintln!(
        "mdsd serve: POST {path} · {} + {} tokens ({} reused) · tau {:.2} · {:.2} tokens/s · {}",
        stats.prompt_tokens, stats.new_tokens, stats.reused_tokens, stats.tau, stats.tokens_per_s, stats.stop_reason
    )
}

/// Server-sent events of one streamed answer.
pub(super) struct Events<'a> {
    kind: Kind,
    /// The choice being streamed.
    index: usize,
    id: &'a str,
    created: u64,
    model: &'a str,
    writer: EventSink,
}

impl Events<'_> {
    /// The `delta` (chat) or `text` (completions) of a piece of the answer.
    fn delta(&self, piece: String) -> Value {
        match self.kind {
            Kind::Chat => json!({"content": piece}),
            Kind::Text => Value::String(piece),
        }
    }

    /// One event of the answer: its next piece (`delta`) with the log-probabilities of its
    /// tokens (`null` unless asked for), and the finish reason in the last.
    fn chunk(&self, delta: Value, finish: Option<&str>, logprobs: Value) -> Value {
        let index = self.index;
        let (object, choice) = match self.kind {
            Kind::Chat => (
                "chat.completion.chunk",
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            ),
            Kind::Text => (
                "text_completion",
                json!({"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}),
            ),
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice]})
    }

    fn send(&mut self, delta: Value, logprobs: Value) -> std::io::Result<()> {
        let event = self.chunk(delta, None, logprobs);
        self.raw(&event.to_string())
    }

    /// One `data:` event.
    fn raw(&mut self, data: &str) -> std::io::Result<()> {
        self.writer.write_all(format!("data: {data}\n\n").as_bytes())
    }
}

fn finish_reason(stats: &Stats) -> &'static str {
    if stats.stop_reason == "stop_token" || stats.stop_reason == "stop_string" {
        "stop"
    } else {
        "length"
    }
}

/// The request's usage: each prompt once, the choices' tokens summed.
fn usage(prompt: usize, done: &[(Stats, u64)]) -> Value {
    let completion: usize = done.iter().map(|(s, _)| s.new_tokens).sum();
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// The speculative decoding statistics and the seed of the first choice (a request's own seed or
/// the one drawn for it); with several choices, `choices` holds each one's. `reused_tokens`
/// only with `show_reused` (`--show-reused-tokens`): it tells how much of the prompt the
/// caches held.
fn mdsd_stats(done: &[(Stats, u64)], show_reused: bool) -> Value {
    let one = |(stats, seed): &(Stats, u64)| {
        let mut v = serde_json::to_value(stats).unwrap_or(Value::Null);
        v["seed"] = (*seed).into();
        if !show_reused {
            if let Some(o) = v.as_object_mut() {
                o.remove("reused_tokens");
            }
        }
        v
    };
    let mut v = done.first().map_or(Value::Null, one);
    if done.len() > 1 {
        v["choices"] = done.iter().map(one).collect();
    }
    v
}
