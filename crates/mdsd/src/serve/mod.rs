//! `mdsd serve`: an HTTP server with OpenAI's completion endpoints (`/v1/completions`,
//! `/v1/chat/completions`, streamed as server-sent events or not, with stop strings
//! ([`engine::decode::stop`]) and
//! log-probabilities (`serve::logprobs`); `/v1/models`, `/tokenize` and `/detokenize`
//! (`serve::tokens`), `/health`, `/metrics` (`serve::metrics`)), on
//! one generator with prefix reuse: a chat client resending its conversation runs only the new
//! turn. Completion requests are answered one at a time, in order, on a worker thread; the
//! listening thread answers `/health`, `/v1/models`, tokenization and refusals at once (a
//! body is read on a thread of its own), queues up to
//! `--max-waiting` completion requests and answers 503 beyond. Part of the `mdsd` binary
//! (`main.rs`).

use crate::cli::GenerateArgs;
use crate::session::{Plan, Session};
use anyhow::{bail, Context};
use clap::Args;
use engine::decode::penalties::Penalties;
use engine::decode::stop::StopStrings;
use engine::decode::{GenerationConfig, Generator};
use engine::tokenizer::TextTokenizer;
use samplers::dist::Warp;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::mpsc::{channel, Sender};
use tiny_http::{Header, Method, Request, Response, Server};

mod answer;
mod logprobs;
mod metrics;
mod refused;
mod tokens;

use metrics::{Load, Outcome};

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
    /// Positions of the caches: the longest prompt plus answer (at most the target's context).
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    /// Run every prompt whole, instead of only what it adds to the last request's text.
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Answer only requests with `Authorization: Bearer KEY` (`/health` and `/metrics`
    /// excepted); default: the
    /// `MDSD_API_KEY` environment variable, else no key.
    #[arg(long, env = "MDSD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Completion requests that may wait while another is answered; more get 503 with
    /// `Retry-After` (`/health` reports the running and waiting counts).
    #[arg(long, default_value_t = 64)]
    pub max_waiting: usize,
}

/// A completion request: OpenAI's fields that change the output, and `ignore_eos` (as vLLM's).
/// Fields that would change the answer and are not implemented are refused (`serve::refused`);
/// others (`model`, `user`, ...) are ignored.
#[derive(Deserialize, Default)]
#[serde(default)]
struct CompletionRequest {
    /// A string, an array of strings, an array of token ids, or an array of such arrays.
    prompt: Option<Value>,
    messages: Option<Vec<ChatMessage>>,
    /// Extra chat template variables (vLLM's), over the server's `--chat-template-kwargs`.
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<usize>,
    min_p: Option<f64>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<u64>,
    stream: bool,
    n: Option<usize>,
    stop: Option<Value>,
    ignore_eos: bool,
    /// Completions: the alternatives per token (an integer); chat: whether to return them.
    logprobs: Option<Value>,
    /// Chat: the alternatives per token.
    top_logprobs: Option<usize>,
    /// Token id (a string) to a bias in [-100, 100] added to its logit.
    logit_bias: Option<serde_json::Map<String, Value>>,
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

/// The text `messages` run as: through the chat template (with the extra variables
/// `kwargs`), the assistant's turn opened.
fn chat_text(
    tok: &TextTokenizer,
    messages: &[ChatMessage],
    kwargs: Option<&serde_json::Map<String, Value>>,
) -> Result<String, Refusal> {
    let texts = messages.iter().map(ChatMessage::text).collect::<Result<Vec<String>, Refusal>>()?;
    let turns: Vec<(&str, &str)> = messages.iter().zip(&texts).map(|(m, t)| (m.role.as_str(), t.as_str())).collect();
    let none = serde_json::Map::new();
    tok.apply_chat_conversation_with(&turns, None, kwargs.unwrap_or(&none))
        .map_err(|e| Refusal(400, format!("messages: {e}")))
}

/// Token ids from a JSON list, each below `vocab` (`None` if one is not).
fn token_ids(list: &[Value], vocab: usize) -> Option<Vec<u32>> {
    list.iter().map(|v| v.as_u64().filter(|&id| (id as usize) < vocab).map(|id| id as u32)).collect()
}

/// What a checked request asks beyond its prompt and generation settings.
struct Checked {
    stream: bool,
    ignore_eos: bool,
    stops: Vec<String>,
    /// Log-probabilities with this many alternatives per token.
    logprobs: Option<usize>,
    /// Completions with `echo`: the prompt put before the answer (and scored, with `logprobs`).
    echo: bool,
    /// Choices to generate, one after the other.
    n: usize,
    /// Added to the logits of the target and the draft (the server's `--logit-bias` when the
    /// request sets none).
    logit_bias: Vec<(u32, f32)>,
    /// Repetition, presence and frequency penalties (the server's flags where unset).
    penalties: Penalties,
}

/// The most choices one request may ask for (`n`).
const MAX_CHOICES: usize = 16;

/// The largest request body read (413 above it): a prompt of the longest contexts and a
/// `logit_bias` over a whole vocabulary fit many times over.
const MAX_BODY_BYTES: usize = 32 << 20;

/// Above this announced length a refused request is left unanswered and never dropped:
/// tiny_http drains an unread body when a request is dropped into one buffer of the announced
/// size, and a `Content-Length` of 10^11 aborted the server on that allocation.
const MAX_DRAINED_BYTES: usize = 1 << 30;

/// The most prompts one completions request may batch.
const MAX_PROMPTS: usize = 64;

/// One prompt of a request: its tokens and its text (echoed with `echo`).
struct Prompt {
    ids: Vec<u32>,
    text: String,
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
        ("--jsonl", run.jsonl),
        ("--logprobs", run.logprobs.is_some()),
        ("--prompt-logprobs", run.prompt_logprobs),
    ] {
        if given {
            bail!("{flag} does not apply to serve: prompts and what to return come with the requests");
        }
    }
    let plan = Plan::new(run)?;
    let session = plan.load(run)?;
    let capacity = args.context.min(session.context);
    // Trees need no room of their own: near the end of the context steps go without drafts.
    if capacity < 3 {
        bail!("--context {} leaves no room for a prompt and a new token", args.context);
    }
    let mut generator = session.generator(run, capacity)?;
    generator.set_prefix_reuse(!args.no_prefix_reuse);
    let server = Server::http((args.host.as_str(), args.port))
        .map_err(|e| anyhow::anyhow!("listening on {}:{}: {e}", args.host, args.port))?;
    let addr = server.server_addr().to_ip().context("the server has no IP address")?;
    let model = session.target.path.file_stem().map_or("target".into(), |s| s.to_string_lossy().to_string());
    eprintln!("--- {}", crate::report::mode(run, session.verifier, session.window(&generator, run)));
    eprintln!(
        "mdsd serve: listening on http://{addr} (model `{model}`, context {capacity}): /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics"
    );
    let front = Front {
        tokenizer: &session.target.tokenizer,
        capacity,
        model: model.clone(),
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_waiting: args.max_waiting,
    };
    let penalties = run.penalties()?;
    let load = Load::default();
    let mut state =
        State { session: &session, generator: &mut generator, run, penalties, capacity, model, served: 0, load: &load };
    std::thread::scope(|scope| {
        // Unbounded: `Load::admit` bounds what waits.
        let (queue, jobs) = channel::<Job>();
        let load = &load;
        scope.spawn(move || {
            let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for job in jobs {
                    load.start();
                    state.answer(job);
                    load.finish();
                }
            }));
            // A bug that panics the generator ends the server (as it did when one thread did
            // everything), rather than leaving it up, healthy to `/health`, unable to answer.
            if answered.is_err() {
                eprintln!("mdsd serve: the generator panicked (a bug; the message is above): exiting");
                std::process::exit(101);
            }
        });
        for request in server.incoming_requests() {
            front.route(request, &queue, load, scope);
        }
    });
    Ok(())
}

/// A completion request (a POST) passed from the listening thread to the generator's, with its
/// body already read.
struct Job {
    request: Request,
    kind: Kind,
    path: String,
    body: String,
}

/// What the listening thread needs to answer the requests that do not generate.
struct Front<'s> {
    /// For `/tokenize` and `/detokenize`.
    tokenizer: &'s TextTokenizer,
    /// The server's `--context` (the `max_model_len` of `/tokenize`).
    capacity: usize,
    model: String,
    api_key: Option<String>,
    /// `--max-waiting`.
    max_waiting: usize,
}

impl<'s> Front<'s> {
    /// Answers `/health`, `/v1/models`, 401, 404 and 405 at once; queues completion requests
    /// (503 when `--max-waiting` of them already wait). A completion request's body is read on
    /// a thread of its own (413 above [`MAX_BODY_BYTES`]) and then queued: a client slow to send
    /// it (or one that announces a body and never sends it) holds up neither the listening
    /// thread nor the generator.
    fn route<'scope>(
        &self,
        request: Request,
        queue: &Sender<Job>,
        load: &'scope Load,
        scope: &'scope std::thread::Scope<'scope, '_>,
    ) where
        's: 'scope,
    {
        let path = request.url().split('?').next().unwrap_or("").to_string();
        let method = request.method().clone();
        // Any endpoint: a body over the limit is refused before routing, off this thread (the
        // refusal drains the body as the client sends it).
        if let Some(n) = request.body_length().filter(|&n| n > MAX_BODY_BYTES) {
            load.count(Outcome::Refused);
            let msg = format!("the body has {n} bytes; the limit is {MAX_BODY_BYTES}");
            eprintln!("mdsd serve: {method} {path}: 413 {msg}");
            if n > MAX_DRAINED_BYTES {
                std::mem::forget(request);
            } else {
                scope.spawn(move || respond_error(request, 413, &msg).ok());
            }
            return;
        }
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
            (_, p, _) if !authorized && p != "/health" && p != "/metrics" => {
                if kind.is_some() {
                    load.count(Outcome::Unauthorized);
                }
                respond_error(request, 401, "a valid API key is needed (Authorization: Bearer KEY)")
            }
            (Method::Get, "/metrics", _) => {
                let header = Header::from_bytes(&b"Content-Type"[..], &b"text/plain; version=0.0.4"[..])
                    .expect("a valid header");
                request.respond(Response::from_string(load.prometheus()).with_header(header))
            }
            (Method::Get, "/health", _) => {
                let (running, waiting) = load.counts();
                respond_json(request, 200, &json!({"status": "ok", "running": running, "waiting": waiting}))
            }
            (Method::Get, "/v1/models", _) => respond_json(
                request,
                200,
                &json!({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "mdsd"}]}),
            ),
            (Method::Post, _, Some(kind)) => match load.admit(self.max_waiting) {
                Ok(()) => {
                    let queue = queue.clone();
                    let path = path.clone();
                    scope.spawn(move || {
                        let mut request = request;
                        let outcome = match read_body(&mut request) {
                            Err((status, msg)) => {
                                load.withdraw();
                                load.count(Outcome::Refused);
                                respond_error(request, status, &msg)
                            }
                            Ok(body) => match queue.send(Job { request, kind, path: path.clone(), body }) {
                                Ok(()) => Ok(()),
                                Err(unsent) => {
                                    load.withdraw();
                                    respond_error(
                                        unsent.0.request,
                                        500,
                                        "the generator has stopped; see the server's log",
                                    )
                                }
                            },
                        };
                        if let Err(e) = outcome {
                            eprintln!("mdsd serve: POST {path}: answering failed: {e}");
                        }
                    });
                    Ok(())
                }
                Err(waiting) => {
                    load.count(Outcome::Busy);
                    let msg = format!("the queue is full: {waiting} waiting (the server's --max-waiting); retry later");
                    eprintln!("mdsd serve: {method} {path}: 503 {msg}");
                    respond_busy(request, &msg)
                }
            },
            (Method::Post, "/tokenize" | "/detokenize", _) => {
                let (tok, capacity, path) = (self.tokenizer, self.capacity, path.clone());
                scope.spawn(move || {
                    let mut request = request;
                    let answer =
                        read_body(&mut request).map_err(|(status, msg)| Refusal(status, msg)).and_then(|body| {
                            if path == "/tokenize" {
                                tokens::tokenize(tok, capacity, &body)
                            } else {
                                tokens::detokenize(tok, &body)
                            }
                        });
                    let outcome = match answer {
                        Ok(value) => respond_json(request, 200, &value),
                        Err(Refusal(status, msg)) => {
                            eprintln!("mdsd serve: POST {path}: {status} {msg}");
                            respond_error(request, status, &msg)
                        }
                    };
                    if let Err(e) = outcome {
                        eprintln!("mdsd serve: POST {path}: answering failed: {e}");
                    }
                });
                Ok(())
            }
            (_, "/health" | "/v1/models" | "/metrics" | "/tokenize" | "/detokenize", _) | (_, _, Some(_)) => {
                respond_error(request, 405, &format!("{method} is not allowed on {path}"))
            }
            _ => respond_error(request, 404, &format!("no endpoint {path}")),
        };
        if let Err(e) = outcome {
            eprintln!("mdsd serve: {method} {path}: answering failed: {e}");
        }
    }
}

/// The generator and the request defaults: the worker thread's state.
struct State<'s, 'g> {
    session: &'s Session,
    generator: &'g mut Generator<'s>,
    run: &'s GenerateArgs,
    /// The penalty flags, checked at start: a request's defaults.
    penalties: Penalties,
    capacity: usize,
    model: String,
    served: u64,
    /// Where finished choices and request outcomes are counted.
    load: &'s Load,
}

impl State<'_, '_> {
    /// Reads, checks and answers one completion request.
    fn answer(&mut self, job: Job) {
        let Job { request, kind, path, body } = job;
        let outcome = match self.complete(kind, &body) {
            Err(Refusal(status, msg)) => {
                eprintln!("mdsd serve: POST {path}: {status} {msg}");
                self.load.count(Outcome::Refused);
                respond_error(request, status, &msg)
            }
            Ok((req, prompts, config)) => {
                self.load.count(Outcome::Generated);
                self.generate(request, kind, &req, &prompts, &config, &path)
            }
        };
        if let Err(e) = outcome {
            eprintln!("mdsd serve: POST {path}: answering failed: {e}");
        }
    }

    /// Parses and checks a completion request: its prompts and generation settings.
    fn complete(&self, kind: Kind, body: &str) -> Result<(Checked, Vec<Prompt>, GenerationConfig), Refusal> {
        // Parsed once: the typed request, and the whole object for the refused fields.
        let json: Value = match serde_json::from_str(body) {
            Ok(v) => v,
            Err(e) => return refuse(400, format!("the body is not a valid request: {e}")),
        };
        let req = match CompletionRequest::deserialize(&json) {
            Ok(r) => r,
            Err(e) => return refuse(400, format!("the body is not a valid request: {e}")),
        };
        let n = req.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return refuse(400, format!("n: from 1 to {MAX_CHOICES} choices"));
        }
        if req.echo && kind == Kind::Chat {
            return refuse(400, "echo: a completions field (chat completions do not echo the messages)");
        }
        let logprobs = logprobs::requested(kind, &req.logprobs, req.top_logprobs)?;
        let vocab = self.session.target.model.config().vocab_size;
        let logit_bias = match &req.logit_bias {
            None => self.run.logit_bias.clone(),
            Some(map) => map
                .iter()
                .map(|(id, bias)| match (id.parse::<u32>(), bias.as_f64()) {
                    (Ok(id), Some(b)) if (id as usize) < vocab && (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                    _ => refuse(
                        400,
                        format!("logit_bias: {id}: {bias}: token ids below {vocab} to biases from -100 to 100"),
                    ),
                })
                .collect::<Result<_, _>>()?,
        };
        let defaults = self.penalties;
        let penalties = Penalties {
            repetition: req.repetition_penalty.unwrap_or(defaults.repetition),
            presence: req.presence_penalty.unwrap_or(defaults.presence),
            frequency: req.frequency_penalty.unwrap_or(defaults.frequency),
        };
        if let Err(e) = penalties.check() {
            return refuse(400, e);
        }
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
        if let Some(msg) = refused::refused_field(&json) {
            return refuse(400, msg);
        }
        let tok = &self.session.target.tokenizer;
        let encode = |text: String| match tok.encode(&text) {
            Ok(ids) if !ids.is_empty() => Ok(Prompt { ids, text }),
            Ok(_) => refuse(400, "the prompt has no tokens"),
            Err(e) => refuse(400, format!("tokenizing the prompt: {e}")),
        };
        let prompts = match (kind, &req.prompt, &req.messages) {
            (Kind::Text, Some(p), _) => {
                prompts(p, tok)?.into_iter().map(|p| p.map_or_else(encode, Ok)).collect::<Result<Vec<_>, _>>()?
            }
            (Kind::Text, None, _) => return refuse(400, "prompt: missing"),
            (Kind::Chat, _, Some(m)) if !m.is_empty() => {
                vec![encode(chat_text(tok, m, req.chat_template_kwargs.as_ref())?)?]
            }
            (Kind::Chat, _, _) => return refuse(400, "messages: missing or empty"),
        };
        if prompts.len() * n > MAX_PROMPTS {
            return refuse(400, format!("prompt: {} prompts x n {n}: at most {MAX_PROMPTS} answers", prompts.len()));
        }
        let defaults = &self.session.config;
        let warp = Warp {
            temperature: req.temperature.unwrap_or(defaults.warp.temperature),
            top_k: req.top_k.unwrap_or(defaults.warp.top_k),
            top_p: req.top_p.unwrap_or(defaults.warp.top_p),
            min_p: req.min_p.unwrap_or(defaults.warp.min_p),
        };
        if let Err(e) = warp.check() {
            return refuse(400, e.to_string());
        }
        for p in &prompts {
            if let Err(e) = self.session.check_fits(p.ids.len(), self.capacity, "prompt") {
                return refuse(400, format!("{e} (the server's --context)"));
            }
        }
        let max_new_tokens = req.max_completion_tokens.or(req.max_tokens).unwrap_or(defaults.max_new_tokens);
        if max_new_tokens == 0 && !req.echo {
            return refuse(400, "max_tokens: at least 1 (0 only with echo, to score the prompt)");
        }
        // Without a seed each request draws one, reported with the answer.
        let seed = req.seed.unwrap_or_else(rand::random);
        let config = GenerationConfig { max_new_tokens, warp, seed, ..defaults.clone() };
        let echo = req.echo;
        let checked =
            Checked { stream: req.stream, ignore_eos: req.ignore_eos, stops, logprobs, echo, n, logit_bias, penalties };
        Ok((checked, prompts, config))
    }
}

/// The prompts of a completions request: each a text to tokenize (`Err`) or token ids, checked
/// against the vocabulary (`Ok`, with their text).
fn prompts(prompt: &Value, tok: &engine::tokenizer::TextTokenizer) -> Result<Vec<Result<Prompt, String>>, Refusal> {
    let vocab = tok.vocab().len();
    let ids = |list: &[Value]| -> Result<Prompt, Refusal> {
        match token_ids(list, vocab) {
            Some(ids) if !ids.is_empty() => {
                let text = tok.decode(&ids).map_err(|e| Refusal(400, format!("prompt: {e}")))?;
                Ok(Prompt { ids, text })
            }
            _ => refuse(400, format!("prompt: token ids must be a non-empty list of ids below {vocab}")),
        }
    };
    match prompt {
        Value::String(s) => Ok(vec![Err(s.clone())]),
        Value::Array(list) if list.is_empty() => refuse(400, "prompt: an empty list"),
        Value::Array(list) if list.iter().all(Value::is_string) => {
            Ok(list.iter().map(|s| Err(s.as_str().unwrap_or_default().to_string())).collect())
        }
        Value::Array(list) if list.iter().all(Value::is_number) => Ok(vec![Ok(ids(list)?)]),
        Value::Array(list) if list.iter().all(Value::is_array) => {
            list.iter().map(|l| ids(l.as_array().map_or(&[][..], Vec::as_slice)).map(Ok)).collect()
        }
        _ => refuse(400, "prompt: a string, an array of strings, an array of token ids, or an array of those"),
    }
}

/// A request's body, at most [`MAX_BODY_BYTES`] (413 above), or the status and message that
/// refuse it.
fn read_body(request: &mut Request) -> Result<String, (u16, String)> {
    let mut body = String::new();
    let mut reader = std::io::Read::take(request.as_reader(), MAX_BODY_BYTES as u64 + 1);
    match std::io::Read::read_to_string(&mut reader, &mut body) {
        Err(e) => Err((400, format!("reading the request body: {e}"))),
        Ok(n) if n > MAX_BODY_BYTES => {
            Err((413, format!("the body has more than the limit of {MAX_BODY_BYTES} bytes")))
        }
        Ok(_) => Ok(body),
    }
}

/// A JSON response with `status`.
fn json_response(status: u16, body: &Value) -> Response<std::io::Cursor<Vec<u8>>> {
    let header = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("a valid header");
    Response::from_string(body.to_string()).with_status_code(status).with_header(header)
}

fn respond_json(request: Request, status: u16, body: &Value) -> std::io::Result<()> {
    request.respond(json_response(status, body))
}

/// OpenAI's error object with `status`.
fn error_response(status: u16, msg: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    let kind = if status < 500 { "invalid_request_error" } else { "server_error" };
    json_response(status, &json!({"error": {"message": msg, "type": kind, "code": status}}))
}

fn respond_error(request: Request, status: u16, msg: &str) -> std::io::Result<()> {
    request.respond(error_response(status, msg))
}

/// 503 with OpenAI's error object and `Retry-After: 1`.
fn respond_busy(request: Request, msg: &str) -> std::io::Result<()> {
    let retry = Header::from_bytes(&b"Retry-After"[..], &b"1"[..]).expect("a valid header");
    request.respond(error_response(503, msg).with_header(retry))
}
