//! `mdsd serve`: an HTTP server with OpenAI's completion endpoints (`/v1/completions`,
//! `/v1/chat/completions`, streamed as server-sent events or not, with stop strings
//! ([`engine::stop`]) and
//! log-probabilities (`serve::logprobs`); `/v1/models`, `/health`), on
//! one generator with prefix reuse: a chat client resending its conversation runs only the new
//! turn. Requests are answered one at a time, in order. Part of the `mdsd` binary (`main.rs`).

use crate::session::{Plan, Session};
use crate::{message, GenerateArgs};
use anyhow::{bail, Context};
use clap::Args;
use engine::decode::{GenerationConfig, Generator, Stats};
use engine::stop::{StopStrings, TextStops};
use samplers::dist::Warp;
use serde::Deserialize;
use serde_json::{json, Value};
use std::cell::Cell;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};
use tiny_http::{Header, Method, Request, Response, Server};

mod logprobs;
mod refused;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The models, tree and sampling defaults, as for `generate` (`--temperature`, `--top-k`,
    /// `--top-p` and `--max-new-tokens` are the defaults of requests that do not set them).
    #[command(flatten)]
    pub run: GenerateArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Positions of the caches: the longest prompt plus answer (at most the models' context).
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    /// Run every prompt whole, instead of only what it adds to the last request's text.
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Answer only requests with `Authorization: Bearer KEY` (`/health` excepted); default: the
    /// `MDSD_API_KEY` environment variable, else no key.
    #[arg(long, env = "MDSD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// A completion request: OpenAI's fields that change the output, and `ignore_eos` (as vLLM's).
/// Fields that would change the answer and are not implemented are refused (`serve::refused`);
/// others (`model`, `user`, ...) are ignored.
#[derive(Deserialize, Default)]
#[serde(default)]
struct CompletionRequest {
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<usize>,
    seed: Option<u64>,
    stream: bool,
    n: Option<usize>,
    stop: Option<Value>,
    ignore_eos: bool,
    /// Completions: the alternatives per token (an integer); chat: whether to return them.
    logprobs: Option<Value>,
    /// Chat: the alternatives per token.
    top_logprobs: Option<usize>,
    echo: bool,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    /// A string, or an array of parts of which only `{"type": "text", "text": ...}` is supported.
    content: Value,
}

impl ChatMessage {
    fn text(&self) -> Result<String, Refusal> {
        match &self.content {
            Value::String(s) => Ok(s.clone()),
            Value::Array(parts) => parts
                .iter()
                .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => Ok(t),
                    _ => refuse(400, "messages: only text content parts are supported"),
                })
                .collect(),
            _ => refuse(400, "messages: content must be a string or an array of text parts"),
        }
    }
}

/// What a checked request asks beyond its prompt and generation settings.
struct Checked {
    stream: bool,
    ignore_eos: bool,
    stops: Vec<String>,
    /// Log-probabilities with this many alternatives per token.
    logprobs: Option<usize>,
    /// Completions with `echo`: the prompt, put before the answer (and scored, with `logprobs`).
    echo: Option<String>,
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Chat,
}

/// A request refused with an HTTP status and a message.
struct Refusal(u16, String);

fn refuse<T>(status: u16, msg: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(status, msg.into()))
}

pub fn serve(mut args: ServeArgs) -> anyhow::Result<()> {
    let run = &mut args.run;
    for (flag, given) in [
        ("--prompt", run.prompt.is_some()),
        ("--prompt-file", run.prompt_file.is_some()),
        ("--json", run.json),
        ("--logprobs", run.logprobs.is_some()),
    ] {
        if given {
            bail!("{flag} does not apply to serve: prompts and what to return come with the requests");
        }
    }
    let plan = Plan::new(run)?;
    let session = plan.load(run)?;
    let capacity = args.context.min(session.context);
    if capacity < 2 * session.tree_len() + 2 {
        bail!("--context {} leaves no room for a prompt with trees of {} nodes", args.context, session.tree_len());
    }
    let mut generator = session.generator(run, capacity)?;
    generator.set_prefix_reuse(!args.no_prefix_reuse);
    let server = Server::http((args.host.as_str(), args.port))
        .map_err(|e| anyhow::anyhow!("listening on {}:{}: {e}", args.host, args.port))?;
    let addr = server.server_addr().to_ip().context("the server has no IP address")?;
    let model = session.target.path.file_stem().map_or("target".into(), |s| s.to_string_lossy().to_string());
    eprintln!("--- {}", crate::report::mode(run, session.verifier, session.window(&generator, run)));
    eprintln!(
        "mdsd serve: listening on http://{addr} (model `{model}`, context {capacity}): /v1/completions, /v1/chat/completions, /v1/models, /health"
    );
    let api_key = args.api_key.clone().filter(|k| !k.is_empty());
    let mut server_state =
        State { session: &session, generator: &mut generator, run, capacity, model, served: 0, api_key };
    for request in server.incoming_requests() {
        server_state.handle(request);
    }
    Ok(())
}

struct State<'s, 'g> {
    session: &'s Session,
    generator: &'g mut Generator<'s>,
    run: &'s GenerateArgs,
    capacity: usize,
    model: String,
    served: u64,
    api_key: Option<String>,
}

impl State<'_, '_> {
    fn handle(&mut self, mut request: Request) {
        let path = request.url().split('?').next().unwrap_or("").to_string();
        let method = request.method().clone();
        let kind = match path.as_str() {
            "/v1/completions" => Some(Kind::Text),
            "/v1/chat/completions" => Some(Kind::Chat),
            _ => None,
        };
        let authorized = match &self.api_key {
            None => true,
            Some(key) => request.headers().iter().any(|h| {
                h.field.equiv("Authorization") && h.value.as_str().strip_prefix("Bearer ") == Some(key.as_str())
            }),
        };
        let outcome = match (&method, path.as_str(), kind) {
            (_, p, _) if !authorized && p != "/health" => {
                respond_error(request, 401, "a valid API key is needed (Authorization: Bearer KEY)")
            }
            (Method::Get, "/health", _) => respond_json(request, 200, &json!({"status": "ok"})),
            (Method::Get, "/v1/models", _) => respond_json(
                request,
                200,
                &json!({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "mdsd"}]}),
            ),
            (Method::Post, _, Some(kind)) => {
                let mut body = String::new();
                match request.as_reader().read_to_string(&mut body) {
                    Err(e) => respond_error(request, 400, &format!("reading the request body: {e}")),
                    Ok(_) => match self.complete(kind, &body) {
                        Err(Refusal(status, msg)) => {
                            eprintln!("mdsd serve: {method} {path}: {status} {msg}");
                            respond_error(request, status, &msg)
                        }
                        Ok((req, ids, config)) => self.generate(request, kind, &req, &ids, &config, &path),
                    },
                }
            }
            (_, "/health" | "/v1/models", _) | (_, _, Some(_)) => {
                respond_error(request, 405, &format!("{method} is not allowed on {path}"))
            }
            _ => respond_error(request, 404, &format!("no endpoint {path}")),
        };
        if let Err(e) = outcome {
            eprintln!("mdsd serve: {method} {path}: answering failed: {e}");
        }
    }

    /// Parses and checks a completion request: its prompt's tokens and generation settings.
    fn complete(&self, kind: Kind, body: &str) -> Result<(Checked, Vec<u32>, GenerationConfig), Refusal> {
        let req: CompletionRequest = match serde_json::from_str(body) {
            Ok(r) => r,
            Err(e) => return refuse(400, format!("the body is not a valid request: {e}")),
        };
        if req.n.is_some_and(|n| n != 1) {
            return refuse(400, "n: only one choice per request is supported");
        }
        if req.echo && kind == Kind::Chat {
            return refuse(400, "echo: a completions field (chat completions do not echo the messages)");
        }
        let logprobs = logprobs::requested(kind, &req.logprobs, req.top_logprobs)?;
        let stops = match &req.stop {
            None | Some(Value::Null) => self.run.stop.clone(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
            }
            Some(_) => return refuse(400, "stop: a string or an array of strings"),
        };
        if let Err(e) = StopStrings::new(stops.clone()) {
            return refuse(400, format!("stop: {e}"));
        }
        // The body parsed above, so it is JSON.
        if let Some(msg) = serde_json::from_str(body).ok().as_ref().and_then(refused::refused_field) {
            return refuse(400, msg);
        }
        let tok = &self.session.target.tokenizer;
        let text = match (kind, &req.prompt, &req.messages) {
            (Kind::Text, Some(p), _) => p.clone(),
            (Kind::Text, None, _) => return refuse(400, "prompt: missing (a string)"),
            (Kind::Chat, _, Some(m)) if !m.is_empty() => {
                let texts = m.iter().map(ChatMessage::text).collect::<Result<Vec<String>, Refusal>>()?;
                let turns: Vec<(&str, &str)> =
                    m.iter().zip(&texts).map(|(m, t)| (m.role.as_str(), t.as_str())).collect();
                match tok.apply_chat_conversation(&turns, None) {
                    Ok(t) => t,
                    Err(e) => return refuse(400, format!("messages: {e}")),
                }
            }
            (Kind::Chat, _, _) => return refuse(400, "messages: missing or empty"),
        };
        let ids = match tok.encode(&text) {
            Ok(ids) if !ids.is_empty() => ids,
            Ok(_) => return refuse(400, "the prompt has no tokens"),
            Err(e) => return refuse(400, format!("tokenizing the prompt: {e}")),
        };
        let defaults = &self.session.config;
        let warp = Warp {
            temperature: req.temperature.unwrap_or(defaults.warp.temperature),
            top_k: req.top_k.unwrap_or(defaults.warp.top_k),
            top_p: req.top_p.unwrap_or(defaults.warp.top_p),
        };
        if let Err(e) = warp.check() {
            return refuse(400, e.to_string());
        }
        // The largest tree depends on the request's warp.
        if let Err(e) = self.session.check_fits(ids.len(), warp, self.capacity, "prompt") {
            return refuse(400, format!("{e} (the server's --context)"));
        }
        let max_new_tokens = req.max_completion_tokens.or(req.max_tokens).unwrap_or(defaults.max_new_tokens);
        if max_new_tokens == 0 && !req.echo {
            return refuse(400, "max_tokens: at least 1 (0 only with echo, to score the prompt)");
        }
        // Without a seed each request draws one, reported with the answer.
        let seed = req.seed.unwrap_or_else(rand::random);
        let config = GenerationConfig { max_new_tokens, warp, seed, ..defaults.clone() };
        let echo = req.echo.then_some(text);
        Ok((Checked { stream: req.stream, ignore_eos: req.ignore_eos, stops, logprobs, echo }, ids, config))
    }

    /// Generates and answers, streamed or in one object.
    fn generate(
        &mut self,
        request: Request,
        kind: Kind,
        req: &Checked,
        ids: &[u32],
        config: &GenerationConfig,
        path: &str,
    ) -> std::io::Result<()> {
        self.served += 1;
        let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, self.served);
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let tok = &self.session.target.tokenizer;
        let ignore_eos = req.ignore_eos || self.run.ignore_eos;
        // The end of turn, else each token's text against the stop strings (checked already).
        let stops = TextStops::new(tok, req.stops.clone(), ignore_eos).expect("stop checked by complete");
        // A streaming client that went away ends the generation at the next token (the caches
        // keep the text for the next request).
        let gone = Cell::new(false);
        let is_stop = |t| gone.get() || stops.is_stop(t);
        let log = |stats: &Stats| {
            eprintln!(
                "mdsd serve: POST {path} · {} + {} tokens ({} reused) · tau {:.2} · {:.2} tokens/s · {}",
                stats.prompt_tokens,
                stats.new_tokens,
                stats.reused_tokens,
                stats.tau,
                stats.tokens_per_s,
                stats.stop_reason
            )
        };
        self.generator.set_logprobs(req.logprobs);
        self.generator.set_prompt_logprobs(req.echo.is_some() && req.logprobs.is_some());
        let echo = req.echo.as_deref().unwrap_or("");
        // Answer tokens' text offsets count the echoed prompt.
        let shift = echo.chars().count();
        if !req.stream {
            let (out, mut stats) = match self.generator.generate(ids, config, is_stop, |_| Ok(())) {
                Ok(r) => r,
                Err(e) => {
                    let msg = message(&anyhow::Error::from(e));
                    eprintln!("mdsd serve: POST {path}: {msg}");
                    return respond_error(request, 500, &msg);
                }
            };
            if stops.stopped() {
                stats.stop_reason = "stop_string".into();
            }
            log(&stats);
            let text = if req.stops.is_empty() {
                match tok.decode(&out) {
                    Ok(t) => t,
                    Err(e) => return respond_error(request, 500, &format!("decoding the answer: {e}")),
                }
            } else {
                stops.answer()
            };
            let text = format!("{echo}{text}");
            let logprobs = match req.logprobs {
                Some(_) => {
                    let records = &self.generator.logprobs()[..stops.tokens_shown(out.len(), true)];
                    let answer = logprobs::format(kind, tok, &stops, records, 0, shift);
                    match req.echo {
                        Some(_) => logprobs::with_prompt(tok, ids, self.generator.prompt_logprobs(), answer),
                        None => answer,
                    }
                }
                None => Value::Null,
            };
            let choice = match kind {
                Kind::Text => {
                    json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(&stats)})
                }
                Kind::Chat => json!({
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(&stats),
                }),
            };
            let body = json!({
                "id": id,
                "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
                "created": created,
                "model": self.model,
                "choices": [choice],
                "usage": usage(&stats),
                "mdsd": mdsd_stats(&stats, config.seed),
            });
            return respond_json(request, 200, &body);
        }
        let mut writer = request.into_writer();
        writer.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
        )?;
        let mut events = Events { kind, id: &id, created, model: &self.model, writer };
        if kind == Kind::Chat {
            events.send(json!({"role": "assistant", "content": ""}), Value::Null)?;
        }
        let mut gathered = logprobs::Gathered::new(shift);
        // The echoed prompt goes first, with its log-probabilities once the prompt pass gave them.
        let mut echo_pending = req.echo.as_deref();
        let echo_event = |events: &mut Events, prompt_records: &[engine::logprobs::TokenLogprobs]| {
            let lp = match req.logprobs {
                Some(_) => {
                    logprobs::with_prompt(tok, ids, prompt_records, logprobs::format(kind, tok, &stops, &[], 0, 0))
                }
                None => Value::Null,
            };
            events.send(events.delta(echo.to_string()), lp)
        };
        let result = self.generator.generate_emitting(ids, config, is_stop, |e| {
            if echo_pending.take().is_some() && echo_event(&mut events, e.prompt_logprobs).is_err() {
                gone.set(true);
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
        });
        match result {
            Ok((_, stats)) if gone.get() => {
                log(&stats);
                eprintln!("mdsd serve: POST {path}: the client went away; the answer ended there");
                return Ok(());
            }
            Ok((_, mut stats)) => {
                if stops.stopped() {
                    stats.stop_reason = "stop_string".into();
                }
                log(&stats);
                if echo_pending.is_some() {
                    echo_event(&mut events, self.generator.prompt_logprobs())?;
                }
                let rest = stops.ready(true);
                let lp = if req.logprobs.is_some() { gathered.next(kind, tok, &stops, true) } else { None };
                if !rest.is_empty() || lp.is_some() {
                    events.send(events.delta(rest), lp.unwrap_or(Value::Null))?;
                }
                let mut last = events.chunk(events.delta(String::new()), Some(finish_reason(&stats)), Value::Null);
                last["usage"] = usage(&stats);
                last["mdsd"] = mdsd_stats(&stats, config.seed);
                events.raw(&last.to_string())?;
            }
            Err(e) => {
                // The status line is out: the error goes as an event.
                let msg = message(&anyhow::Error::from(e));
                eprintln!("mdsd serve: POST {path}: {msg}");
                events.raw(&json!({"error": {"message": msg, "type": "server_error", "code": 500}}).to_string())?;
            }
        }
        events.finish()
    }
}

/// Server-sent events of one streamed answer.
struct Events<'a> {
    kind: Kind,
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
        let (object, choice) = match self.kind {
            Kind::Chat => (
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            ),
            Kind::Text => {
                ("text_completion", json!({"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}))
            }
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

fn usage(stats: &Stats) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.new_tokens,
        "total_tokens": stats.prompt_tokens + stats.new_tokens,
    })
}

/// The speculative decoding statistics and the seed (a request's own or the one drawn for it).
fn mdsd_stats(stats: &Stats, seed: u64) -> Value {
    let mut v = serde_json::to_value(stats).unwrap_or(Value::Null);
    v["seed"] = seed.into();
    v
}

fn respond_json(request: Request, status: u16, body: &Value) -> std::io::Result<()> {
    let header = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("a valid header");
    request.respond(Response::from_string(body.to_string()).with_status_code(status).with_header(header))
}

/// OpenAI's error object.
fn respond_error(request: Request, status: u16, msg: &str) -> std::io::Result<()> {
    let kind = if status < 500 { "invalid_request_error" } else { "server_error" };
    respond_json(request, status, &json!({"error": {"message": msg, "type": kind, "code": status}}))
}
