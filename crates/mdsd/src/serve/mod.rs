//! `mdsd serve`: an HTTP server with OpenAI's completion endpoints (`/v1/completions`,
//! `/v1/chat/completions`, streamed as server-sent events or not, with stop strings
//! ([`engine::decode::stop`]) and log-probabilities ([`logprobs`])), `/v1/models`, `/tokenize`
//! and `/detokenize` ([`tokens`]), `/health` and `/metrics` ([`metrics`]).
//!
//! Up to `--max-batch` completion requests are answered at once, each on a generator of its own
//! ([`pool`]: caches per request, prefix reuse within a tenant), their forwards batched into
//! one (`engine::model::Batcher`): a new request's prompt runs in chunks between the others'
//! steps, and each answer equals the one its request gets alone. Up to `--max-waiting` more
//! wait for a slot; beyond, 503. The HTTP layer ([`http`]) bounds connections, headers and
//! bodies in time and size, checks hosts, content types and the API key, and stops
//! gracefully on SIGTERM or Ctrl-C.

use crate::cli::GenerateArgs;
use crate::session::{Plan, Session};
use anyhow::{bail, Context};
use clap::Args;
use engine::decode::Generator;
use engine::model::Batcher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod answer;
mod deadline;
mod http;
mod logprobs;
mod metrics;
mod pool;
mod refused;
mod reply;
mod request;
mod tokens;

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
    /// Positions of each request's caches: the longest prompt plus answer (at most the target's
    /// context).
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    /// A bound on the KV caches' positions in all (default: --max-batch x --context); with it,
    /// each request's caches hold --kv-cache-tokens / --max-batch positions.
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Run every prompt whole, instead of only what it adds to a cached text of its tenant.
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Listen at once, without the warm-up generations (the first request then pays for the
    /// first forwards' one-time work and for `--tree auto`'s cost measurements).
    #[arg(long)]
    pub no_warmup: bool,
    /// Let every client reuse every other's cached prefixes (default: within one API key, or
    /// one client address when no key is set).
    #[arg(long)]
    pub shared_prefix_cache: bool,
    /// Put `reused_tokens` (how much of the prompt the caches held) in the answers' `mdsd`
    /// statistics (default: only in the server's log and /metrics).
    #[arg(long)]
    pub show_reused_tokens: bool,
    /// Answer only requests with `Authorization: Bearer KEY` (`/health` and `/metrics`
    /// excepted), for any of these keys (repeatable, or comma-separated); each key is a tenant
    /// of its own for prefix reuse. Default: the `MDSD_API_KEY` environment variable, else no
    /// key.
    #[arg(long, env = "MDSD_API_KEY", hide_env_values = true, value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// Completion requests that may wait for a slot; more get 503 with `Retry-After`
    /// (`/health` reports the running and waiting counts).
    #[arg(long, default_value_t = 64)]
    pub max_waiting: usize,
    /// Connections open at once; more are closed as they arrive.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers (and an idle connection stays open).
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body.
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Seconds a write to a client may wait for it to read before its connection (and answer)
    /// is ended.
    #[arg(long, default_value_t = 30.0)]
    pub write_timeout: f64,
    /// Seconds running answers get to end after SIGTERM or Ctrl-C before they are ended.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_grace: f64,
    /// Host names (the `Host` header) the server answers besides addresses and `localhost`
    /// (repeatable; `*`: any). Guards against web pages reaching it through DNS rebinding.
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
}

/// Requests answered at once when `--max-batch` is not given.
pub const DEFAULT_MAX_BATCH: usize = 4;

/// A request's end flags: its own (its client went away) and the server's (stopping past its
/// grace period).
pub(super) struct Cancel {
    own: Arc<AtomicBool>,
    server: Arc<AtomicBool>,
}

impl Cancel {
    pub(super) fn is_set(&self) -> bool {
        self.own.load(Ordering::SeqCst) || self.server.load(Ordering::SeqCst)
    }

    /// Whether the server (not the client) ended the answer.
    pub(super) fn by_server(&self) -> bool {
        self.server.load(Ordering::SeqCst) && !self.own.load(Ordering::SeqCst)
    }
}

/// What every request shares.
pub(super) struct App {
    session: &'static Session,
    run: &'static GenerateArgs,
    penalties: engine::decode::penalties::Penalties,
    capacity: usize,
    model: String,
    load: metrics::Load,
    pool: Arc<pool::Pool>,
    batcher: Arc<Batcher>,
    api_keys: Vec<String>,
    allowed_hosts: Vec<String>,
    shared_prefix_cache: bool,
    show_reused_tokens: bool,
    limits: http::Limits,
    stopping: AtomicBool,
    cancel_all: Arc<AtomicBool>,
    served: AtomicU64,
    tokenize_slots: tokio::sync::Semaphore,
}

impl App {
    fn defaults(&self) -> request::Defaults<'static> {
        request::Defaults { session: self.session, run: self.run, penalties: self.penalties, capacity: self.capacity }
    }
}

/// A duration of `secs` seconds, checked.
fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    if !(secs.is_finite() && secs > 0.0 && secs < 1e6) {
        bail!("{flag} {secs}: a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Two short generations on one slot before the server listens, at temperature 0 and at 0.7
/// (whose `--tree auto` candidates are wider), as llama.cpp's server and vLLM warm up: the
/// first request then pays neither for the first forwards' one-time work nor for `auto`'s
/// forward-cost measurements (0.45-0.54 s for the default pair on a 2-vCPU EPYC:
/// docs/results/README.md#const-serve-warm-up), which the slots share (`CostBook`). The slot
/// forgets the text after. Returns the seconds taken.
fn warm_up(session: &Session, generator: &mut Generator, capacity: usize) -> anyhow::Result<f64> {
    let start = std::time::Instant::now();
    let vocab = session.target.model.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..8.min(capacity as u32 - 2)).map(|i| (i * 7 + 1) % vocab).collect();
    for temperature in [0.0, 0.7] {
        let warp = samplers::dist::Warp { temperature, ..session.config.warp };
        let config = engine::decode::GenerationConfig { max_new_tokens: 1, warp, seed: 0, ..session.config.clone() };
        generator.generate(&prompt, &config, |_| false, |_| Ok(()))?;
    }
    generator.forget_cached_text();
    Ok(start.elapsed().as_secs_f64())
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs { run, .. } = &args;
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
    if args.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let limits = http::Limits {
        max_connections: args.max_connections,
        header_timeout: seconds("--header-timeout", args.header_timeout)?,
        body_timeout: seconds("--body-timeout", args.body_timeout)?,
        write_timeout: seconds("--write-timeout", args.write_timeout)?,
        shutdown_grace: seconds("--shutdown-grace", args.shutdown_grace)?,
    };
    // The process serves until it stops: its models and flags live as long.
    let args: &'static ServeArgs = Box::leak(Box::new(args));
    let run = &args.run;
    let plan = Plan::new(run)?;
    let session: &'static Session = Box::leak(Box::new(plan.load(run)?));
    let max_batch = run.max_batch.map_or(DEFAULT_MAX_BATCH, usize::from);
    let per_slot = args.kv_cache_tokens.map_or(args.context, |t| args.context.min(t / max_batch));
    let capacity = per_slot.min(session.context);
    // Trees need no room of their own: near the end of the context steps go without drafts.
    if capacity < 3 {
        bail!(
            "{} positions per request leave no room for a prompt and a new token (--context, --kv-cache-tokens / --max-batch)",
            capacity
        );
    }
    let mut generators: Vec<Generator<'static>> = session.generators(run, capacity, max_batch)?;
    for g in &mut generators {
        g.set_prefix_reuse(!args.no_prefix_reuse);
    }
    if !args.no_warmup {
        let secs = warm_up(session, &mut generators[0], capacity).context("warming up")?;
        eprintln!("mdsd serve: warmed up in {secs:.1} s (first forwards run, `auto`'s forward costs measured)");
    }
    let model = session.target.path.file_stem().map_or("target".into(), |s| s.to_string_lossy().to_string());
    eprintln!("--- {}", crate::report::mode(run, session.verifier, session.window(&generators[0], run)));
    let app = Arc::new(App {
        session,
        run,
        penalties: run.penalties()?,
        capacity,
        model: model.clone(),
        load: metrics::Load::default(),
        pool: pool::Pool::new(generators, args.max_waiting),
        batcher: Batcher::new(),
        api_keys: args.api_key.iter().filter(|k| !k.is_empty()).cloned().collect(),
        allowed_hosts: args.allowed_hosts.clone(),
        shared_prefix_cache: args.shared_prefix_cache,
        show_reused_tokens: args.show_reused_tokens,
        limits,
        stopping: AtomicBool::new(false),
        cancel_all: Arc::new(AtomicBool::new(false)),
        served: AtomicU64::new(0),
        tokenize_slots: tokio::sync::Semaphore::new(4),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(max_batch + 16)
        .enable_all()
        .build()
        .context("starting the server's runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr().context("the server has no address")?;
        eprintln!(
            "mdsd serve: listening on http://{addr} (model `{model}`, {} requests at once, context {capacity} each): /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics",
            max_batch
        );
        http::serve(app, listener).await;
        anyhow::Ok(())
    })?;
    // Generation threads still blocked on nothing of ours end with the process.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
