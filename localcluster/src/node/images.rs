//! Images made on this machine, offline, from files it has (Debian's busybox-static, the Go
//! binaries built by `scripts/k8s-bins.sh`): each one layer written here as a `docker save`
//! archive under the name pods use, then pushed to the cluster's registry (`registry.rs`),
//! which the nodes pull from. (A single static layer needs no image builder; the operator's
//! image from its Dockerfile comes as an archive `scripts/image.sh` built with buildah.)

use super::config::PAUSE_IMAGE;
use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The image tests and examples run shell commands in (`busybox:1.36` in pod specs).
const BUSYBOX_IMAGE: &str = "docker.io/library/busybox:1.36";
/// The Redis image the chart names by default. Its content is Debian's redis-server (7.0 on
/// bookworm, not 7.2) with busybox for `start-redis.sh`: the name is what pods ask for.
const REDIS_IMAGE: &str = "docker.io/library/redis:7.2-alpine";
const BUSYBOX: &str = "/bin/busybox";
const REDIS_SERVER: &str = "/usr/bin/redis-server";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What an image of `Options::images` is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// A program of this machine, with its shared libraries, as distroless/cc would hold it
    /// (`program_image`).
    Program(PathBuf),
    /// A `docker save` archive built elsewhere (`scripts/image.sh` builds the Dockerfile into
    /// one), holding the image under the reference it is given for.
    Archive(PathBuf),
}

/// One image: files copied in (from, path in the image), symbolic links, entrypoint,
/// command and user.
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    pub name: String,
    pub files: Vec<(PathBuf, String)>,
    pub links: Vec<(String, String)>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: Option<String>,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The images every node has: the sandbox image, busybox, CoreDNS and Redis.
pub fn node_images(bin_dir: &Path, coredns_image: &str) -> Result<Vec<ImageSpec>, Error> {
    let busybox = busybox_files()?;
    let mut redis = busybox.clone();
    redis.files.extend(with_libraries(Path::new(REDIS_SERVER))?);
    Ok(vec![
        // The sandbox holds the pod's namespaces and does nothing: containerd stops it with
        // SIGKILL, so a plain sleep serves as well as the pause program.
        ImageSpec {
            name: PAUSE_IMAGE.into(),
            files: vec![(BUSYBOX.into(), BUSYBOX.into())],
            entrypoint: strings(&[BUSYBOX, "sleep", "2147483647"]),
            ..ImageSpec::default()
        },
        ImageSpec {
            name: BUSYBOX_IMAGE.into(),
            cmd: strings(&["sh"]),
            ..busybox
        },
        ImageSpec {
            name: coredns_image.into(),
            files: vec![(bin_dir.join("coredns"), "/coredns".into())],
            entrypoint: strings(&["/coredns"]),
            ..ImageSpec::default()
        },
        // The user redis images run as; the chart sets it too.
        ImageSpec {
            name: REDIS_IMAGE.into(),
            cmd: strings(&["redis-server"]),
            user: Some("999:999".into()),
            ..redis
        },
    ])
}

/// An image of one program of this machine, as distroless/cc would hold it: the program at
/// /usr/local/bin, the shared libraries it loads, CA certificates, user 65532, no shell.
pub fn program_image(name: &str, program: &Path) -> Result<ImageSpec, Error> {
    let file_name = program
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Host(format!("{}: not a program's path", program.display())))?;
    let in_image = format!("/usr/local/bin/{file_name}");
    let mut files = with_libraries(program)?;
    files[0].1 = in_image.clone();
    if Path::new(CA_BUNDLE).exists() {
        files.push((CA_BUNDLE.into(), CA_BUNDLE.into()));
    }
    Ok(ImageSpec {
        name: name.to_string(),
        files,
        entrypoint: vec![in_image],
        user: Some("65532:65532".into()),
        ..ImageSpec::default()
    })
}

fn busybox_files() -> Result<ImageSpec, Error> {
    let output = Command::new(BUSYBOX).arg("--list").output().map_err(|e| {
        Error::Host(format!(
            "run {BUSYBOX}: {e} (install busybox-static: scripts/deps.sh)"
        ))
    })?;
    let links = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|a| *a != "busybox")
        .map(|a| (format!("/bin/{a}"), "busybox".to_string()))
        .collect();
    Ok(ImageSpec {
        files: vec![(BUSYBOX.into(), BUSYBOX.into())],
        links,
        ..ImageSpec::default()
    })
}

/// The program (first) and every shared library `ldd` says it loads, at the same paths.
fn with_libraries(program: &Path) -> Result<Vec<(PathBuf, String)>, Error> {
    let output = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(|e| Error::Host(format!("ldd {}: {e}", program.display())))?;
    let mut files = vec![(program.to_path_buf(), program.display().to_string())];
    // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)";
    // a static program has none ("not a dynamic executable", exit status 1).
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            files.push((PathBuf::from(path), path.to_string()));
        }
    }
    Ok(files)
}

/// The references a docker archive holds images under (its manifest's `RepoTags`).
pub fn archive_tags(archive: &Path) -> Result<Vec<String>, Error> {
    let what = format!("read the image archive {}", archive.display());
    let io = |e| Error::io("read an image archive", e);
    let file = std::fs::File::open(archive).map_err(io)?;
    let mut entries = tar::Archive::new(file);
    for entry in entries.entries().map_err(io)? {
        let entry = entry.map_err(io)?;
        if entry.path().map_err(io)?.as_os_str() != "manifest.json" {
            continue;
        }
        let manifest: Vec<serde_json::Value> = serde_json::from_reader(entry)
            .map_err(|e| Error::Host(format!("{what}: manifest.json: {e}")))?;
        let tags = manifest
            .iter()
            .filter_map(|image| image["RepoTags"].as_array());
        return Ok(tags
            .flatten()
            .filter_map(|tag| tag.as_str().map(str::to_string))
            .collect());
    }
    Err(Error::Host(format!(
        "{what}: no manifest.json (not a docker archive)"
    )))
}

/// Writes each image as a docker archive into `work`.
pub fn write_archives(specs: &[ImageSpec], work: &Path) -> Result<Vec<(String, PathBuf)>, Error> {
    std::fs::create_dir_all(work).map_err(|e| Error::io("create the image build directory", e))?;
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let archive = work.join(format!("image-{i}.tar"));
            write_archive(spec, &archive).map(|()| (spec.name.clone(), archive))
        })
        .collect()
}

/// Imports the archives into containerd at `socket`, in its `namespace` (`k8s.io` is the
/// kubelet's).
pub fn import(
    archives: &[(String, PathBuf)],
    bin_dir: &Path,
    socket: &str,
    namespace: &str,
) -> Result<(), Error> {
    for (name, archive) in archives {
        let archive = archive.display().to_string();
        ctr(
            bin_dir,
            socket,
            namespace,
            &["images", "import", &archive],
            name,
        )?;
    }
    Ok(())
}

/// `ctr --address SOCKET -n NAMESPACE ARGS...`; a failure names its first two arguments, the
/// image it was about and ctr's message.
pub fn ctr(
    bin_dir: &Path,
    socket: &str,
    namespace: &str,
    args: &[&str],
    image: &str,
) -> Result<(), Error> {
    let output = Command::new(bin_dir.join("ctr"))
        .args(["--address", socket, "-n", namespace])
        .args(args)
        .output()
        .map_err(|e| Error::io("run ctr", e))?;
    if output.status.success() {
        return Ok(());
    }
    let command = args.iter().take(2).copied().collect::<Vec<_>>().join(" ");
    Err(Error::Host(format!(
        "ctr {command} {image}: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The image's one layer: its files, links and the directories programs expect, owned by
/// root, with no timestamps (the same inputs give the same layer).
fn layer(spec: &ImageSpec) -> Result<Vec<u8>, Error> {
    let io = |what| move |e| Error::io(what, e);
    let mut tar = tar::Builder::new(Vec::new());
    let mut dir = |path: &str, mode: u32| -> Result<(), Error> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(mode);
        header.set_size(0);
        tar.append_data(&mut header, path, std::io::empty())
            .map_err(io("write an image layer"))
    };
    // The directories programs expect (/tmp writable by all), then every file's parents;
    // sorted, so each parent comes before what it holds.
    let mut dirs: std::collections::BTreeMap<PathBuf, u32> = [
        ("bin", 0o755),
        ("etc", 0o755),
        ("tmp", 0o1777),
        ("proc", 0o755),
        ("sys", 0o755),
        ("dev", 0o755),
    ]
    .into_iter()
    .map(|(path, mode)| (PathBuf::from(path), mode))
    .collect();
    for (_, to) in &spec.files {
        let parents = Path::new(to.trim_start_matches('/')).ancestors().skip(1);
        for parent in parents.filter(|p| !p.as_os_str().is_empty()) {
            dirs.entry(parent.to_path_buf()).or_insert(0o755);
        }
    }
    for (path, mode) in &dirs {
        dir(&format!("{}/", path.display()), *mode)?;
    }
    for (from, to) in &spec.files {
        let bytes = std::fs::read(from).map_err(io("read a file for an image"))?;
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_size(bytes.len() as u64);
        tar.append_data(&mut header, to.trim_start_matches('/'), bytes.as_slice())
            .map_err(io("write an image layer"))?;
    }
    for (link, target) in &spec.links {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        tar.append_link(&mut header, link.trim_start_matches('/'), target)
            .map_err(io("write an image layer"))?;
    }
    tar.into_inner().map_err(io("write an image layer"))
}

/// A `docker save` archive: the layer, the image configuration and a manifest naming it.
fn write_archive(spec: &ImageSpec, path: &Path) -> Result<(), Error> {
    let io = |what| move |e| Error::io(what, e);
    let layer = layer(spec)?;
    let layer_digest = sha256_hex(&layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": spec.entrypoint,
            "Cmd": spec.cmd,
            "User": spec.user.clone().unwrap_or_default(),
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    }))
    .map_err(|e| Error::Host(format!("encode an image configuration: {e}")))?;
    let config_name = format!("{}.json", sha256_hex(&config));
    let layer_name = format!("{layer_digest}/layer.tar");
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name,
        "RepoTags": [spec.name],
        "Layers": [layer_name],
    }]))
    .map_err(|e| Error::Host(format!("encode an image manifest: {e}")))?;
    let file = std::fs::File::create(path).map_err(io("create an image archive"))?;
    let mut archive = tar::Builder::new(file);
    for (name, bytes) in [
        (config_name.as_str(), &config),
        (layer_name.as_str(), &layer),
        ("manifest.json", &manifest),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(bytes.len() as u64);
        archive
            .append_data(&mut header, name, bytes.as_slice())
            .map_err(io("write an image archive"))?;
    }
    archive.finish().map_err(io("write an image archive"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_names_the_image_it_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let program = dir.path().join("program");
        std::fs::write(&program, b"#!/bin/sh\n").expect("write a file");
        let spec = ImageSpec {
            name: "example.test/app:1".into(),
            files: vec![(program, "/app".into())],
            ..ImageSpec::default()
        };
        let archives = write_archives(&[spec], dir.path()).expect("write the archive");
        let tags = archive_tags(&archives[0].1).expect("read the archive");
        assert_eq!(tags, ["example.test/app:1"]);
    }

    #[test]
    fn a_file_that_is_no_docker_archive_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_an_archive = dir.path().join("empty.tar");
        tar::Builder::new(std::fs::File::create(&not_an_archive).expect("create"))
            .finish()
            .expect("an empty tar");
        let error = archive_tags(&not_an_archive).expect_err("no manifest.json");
        assert!(
            error.to_string().contains("not a docker archive"),
            "{error}"
        );
    }
}
