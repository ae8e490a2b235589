//! Answering a checked request: `n` choices for each of its prompts, one after the other on
//! the one generator (choice `i`, counted over all prompts, with the seed `seed + i`; after a
//! prompt's first choice, its cached rows are reused), in one JSON object or streamed as
//! server-sent events.

use super::{logprobs, respond_error, respond_json, Checked, Kind, Prompt, State};
use crate::report::message;
use engine::decode::logprobs::TokenLogprobs;
use engine::decode::stop::TextStops;
use engine::decode::{GenerationConfig, Stats};
use serde_json::{json, Value};
use std::cell::Cell;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};
use tiny_http::Request;

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

impl<'s> State<'s, '_> {
    /// Generates the request's choices and answers, streamed or in one object.
    pub(super) fn generate(
        &mut self,
        request: Request,
        kind: Kind,
        req: &Checked,
        prompts: &[Prompt],
        config: &GenerationConfig,
        path: &str,
    ) -> std::io::Result<()> {
        self.served += 1;
        let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, self.served);
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
                        self.load.add_choice(&stats);
                        done.push((stats, config.seed));
                    }
                    Err(msg) => return respond_error(request, 500, &msg),
                }
            }
            let body = json!({
                "id": id,
                "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
                "created": created,
                "model": self.model,
                "choices": choices,
                "usage": usage(prompt_tokens, &done),
                "mdsd": mdsd_stats(&done),
            });
            return respond_json(request, 200, &body);
        }
        let mut writer = request.into_writer();
        writer.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
        )?;
        let model = self.model.clone();
        let mut events = Events { kind, index: 0, id: &id, created, model: &model, writer };
        for (index, (ask, config)) in asks.iter().enumerate() {
            events.index = index;
            if index % req.n == 0 {
                prompt_records = None;
            }
            match self.answer_streamed(*ask, config, &mut events, &mut prompt_records)? {
                Streamed::Done(stats) => {
                    let stats = *stats;
                    self.load.add_choice(&stats);
                    let mut last = events.chunk(events.delta(String::new()), Some(finish_reason(&stats)), Value::Null);
                    done.push((stats, config.seed));
                    // The last event carries the request's usage and statistics.
                    if index + 1 == asks.len() {
                        last["usage"] = usage(prompt_tokens, &done);
                        last["mdsd"] = mdsd_stats(&done);
                    }
                    events.raw(&last.to_string())?;
                }
                Streamed::Gone => return Ok(()),
                Streamed::Failed => break,
            }
        }
        events.finish()
    }

    /// Sets whether this choice scores the echoed prompt, and returns its stop matcher.
    fn prepare(&mut self, ask: Ask, prompt_records: &Option<Vec<TokenLogprobs>>) -> TextStops<'s> {
        let req = ask.req;
        let session: &'s crate::session::Session = self.session;
        let tok = &session.target.tokenizer;
        let ignore_eos = req.ignore_eos || self.run.ignore_eos;
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
        let session = self.session;
        let tok = &session.target.tokenizer;
        let (out, mut stats) = self.generator.generate(ids, config, |t| stops.is_stop(t), |_| Ok(())).map_err(|e| {
            let msg = message(&anyhow::Error::from(e));
            eprintln!("mdsd serve: POST {path}: {msg}");
            msg
        })?;
        if stops.stopped() {
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
        let session = self.session;
        let tok = &session.target.tokenizer;
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
            |t| gone.get() || stops.is_stop(t),
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
            Ok((_, mut stats)) if gone.get() => {
                stats.stop_reason = "client_gone".into();
                log(path, &stats);
                eprintln!("mdsd serve: POST {path}: the client went away; the answer ended there");
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
    writer: Box<dyn Write + Send>,
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

    /// One `data:` event as one HTTP chunk, flushed.
    fn raw(&mut self, data: &str) -> std::io::Result<()> {
        let event = format!("data: {data}\n\n");
        write!(self.writer, "{:x}\r\n{event}\r\n", event.len())?;
        self.writer.flush()
    }

    /// `data: [DONE]` and the chunked body's end.
    fn finish(&mut self) -> std::io::Result<()> {
        self.raw("[DONE]")?;
        self.writer.write_all(b"0\r\n\r\n")?;
        self.writer.flush()
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
/// the one drawn for it); with several choices, `choices` holds each one's.
fn mdsd_stats(done: &[(Stats, u64)]) -> Value {
    let one = |(stats, seed): &(Stats, u64)| {
        let mut v = serde_json::to_value(stats).unwrap_or(Value::Null);
        v["seed"] = (*seed).into();
        v
    };
    let mut v = done.first().map_or(Value::Null, one);
    if done.len() > 1 {
        v["choices"] = done.iter().map(one).collect();
    }
    v
}
