//! deploy/docker/Dockerfile, checked without docker (no docker daemon in CI): every final
//! stage is a distroless or scratch image with a numeric non-root USER holding one binary
//! copied from the build stage; the build stage's `cargo build` names packages and binaries
//! that exist in this workspace; and every image the manifests, overlays and chart name is one
//! of the Dockerfile's targets. Not checked here (needs docker): that the image builds, that
//! the base images exist and that the binary runs on them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The registry path the manifests name images under: `<REGISTRY>/<target>:<tag>`.
const REGISTRY: &str = "ghcr.io/local-activator/";

#[derive(Debug)]
struct Stage {
    base: String,
    name: Option<String>,
    /// (instruction, arguments) with continuation lines joined.
    instructions: Vec<(String, String)>,
}

/// The Dockerfile's stages, comments dropped and `\` continuations joined.
fn stages(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(t);
            logical.push(std::mem::take(&mut current));
        }
    }
    assert!(current.is_empty(), "a continuation runs off the end");
    let mut stages: Vec<Stage> = Vec::new();
    for l in logical.into_iter().filter(|l| !l.is_empty()) {
        let (ins, args) = l.split_once(' ').unwrap_or((&l, ""));
        let ins = ins.to_ascii_uppercase();
        let args = args.trim().to_string();
        if ins == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, n] if as_.eq_ignore_ascii_case("as") => Some(n.to_string()),
                [_] => None,
                other => panic!("FROM {other:?}"),
            };
            stages.push(Stage {
                base: words[0].to_string(),
                name,
                instructions: Vec::new(),
            });
        } else if ins == "ARG" && stages.is_empty() {
            // global build argument
        } else {
            stages
                .last_mut()
                .unwrap_or_else(|| panic!("{ins} before FROM"))
                .instructions
                .push((ins, args));
        }
    }
    stages
}

/// Packages of the workspace, each with its binaries (read from the Cargo.toml files: an
/// explicit `[[bin]]` name, or the package's own name for `src/main.rs`).
fn workspace_binaries() -> BTreeMap<String, BTreeSet<String>> {
    let ws = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members_line = ws
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members list");
    let members: Vec<String> = members_line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect();
    assert!(!members.is_empty());
    let mut out = BTreeMap::new();
    for m in members {
        let dir = root().join(&m);
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let mut section = String::new();
        let mut package = None;
        let mut bins = BTreeSet::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            let Some(value) = line.strip_prefix("name").map(str::trim) else {
                continue;
            };
            let Some(value) = value.strip_prefix('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"').to_string();
            match section.as_str() {
                "[package]" => package = Some(value),
                "[[bin]]" => {
                    bins.insert(value);
                }
                _ => {}
            }
        }
        let package = package.unwrap_or_else(|| panic!("{m}: no package name"));
        if Path::new(&dir.join("src/main.rs")).exists() {
            bins.insert(package.clone());
        }
        out.insert(package, bins);
    }
    out
}

fn dockerfile() -> Vec<Stage> {
    let path = root().join("deploy/docker/Dockerfile");
    stages(&std::fs::read_to_string(path).unwrap())
}

/// Final stages: those no other stage builds on or copies from.
fn finals(stages: &[Stage]) -> Vec<&Stage> {
    let used: BTreeSet<String> = stages
        .iter()
        .flat_map(|s| {
            let from = std::iter::once(s.base.clone());
            let copies = s.instructions.iter().filter_map(|(i, a)| {
                (i == "COPY")
                    .then(|| a.split_whitespace().find_map(|w| w.strip_prefix("--from=")))
                    .flatten()
                    .map(String::from)
            });
            from.chain(copies).collect::<Vec<_>>()
        })
        .collect();
    stages
        .iter()
        .filter(|s| s.name.as_ref().is_none_or(|n| !used.contains(n)))
        .collect()
}

#[test]
fn final_stages_are_distroless_non_root_and_hold_one_binary() {
    let stages = dockerfile();
    let finals = finals(&stages);
    let names: BTreeSet<&str> = finals.iter().filter_map(|s| s.name.as_deref()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["activator", "loadtest", "node-agent", "subsetter"]),
        "one final stage per binary"
    );
    for s in finals {
        let name = s.name.as_deref().unwrap();
        assert!(
            s.base.starts_with("gcr.io/distroless/") || s.base == "scratch",
            "{name}: base {} is neither distroless nor scratch",
            s.base
        );
        let of = |ins: &str| -> Vec<&String> {
            s.instructions
                .iter()
                .filter(|(i, _)| i == ins)
                .map(|(_, a)| a)
                .collect()
        };
        for forbidden in ["RUN", "ADD"] {
            assert!(
                of(forbidden).is_empty(),
                "{name}: {forbidden} in a final stage"
            );
        }
        // USER uid[:gid], numeric (a name needs /etc/passwd and cannot be checked by the
        // kubelet's runAsNonRoot) and not root.
        let users = of("USER");
        assert_eq!(users.len(), 1, "{name}: one USER");
        for id in users[0].split(':') {
            let n: u32 = id
                .parse()
                .unwrap_or_else(|_| panic!("{name}: USER {} is not numeric", users[0]));
            assert_ne!(n, 0, "{name}: USER is root");
        }
        let copies = of("COPY");
        assert_eq!(copies.len(), 1, "{name}: exactly one COPY");
        let words: Vec<&str> = copies[0].split_whitespace().collect();
        let (flags, paths): (Vec<&str>, Vec<&str>) =
            words.iter().partition(|w| w.starts_with("--"));
        assert_eq!(
            flags,
            ["--from=build"],
            "{name}: COPY from the build stage only"
        );
        assert_eq!(paths.len(), 2, "{name}: one source, one destination");
        assert_eq!(
            Path::new(paths[0]).file_name().unwrap(),
            name,
            "{name}: copies its own binary"
        );
        let entry = of("ENTRYPOINT");
        assert_eq!(entry.len(), 1, "{name}: one ENTRYPOINT");
        let entry: Vec<String> = serde_json::from_str(entry[0]).expect("exec-form ENTRYPOINT");
        assert_eq!(entry, [paths[1]], "{name}: runs the copied binary");
    }
}

#[test]
fn the_build_stage_builds_workspace_binaries_the_final_stages_copy() {
    let stages = dockerfile();
    let build = stages
        .iter()
        .find(|s| s.name.as_deref() == Some("build"))
        .expect("a build stage");
    let runs: Vec<&String> = build
        .instructions
        .iter()
        .filter(|(i, _)| i == "RUN")
        .map(|(_, a)| a)
        .collect();
    let cargo = runs
        .iter()
        .flat_map(|r| r.split("&&"))
        .map(str::trim)
        .map(|c| {
            // Drop RUN's own --mount flags.
            c.split_whitespace()
                .skip_while(|w| w.starts_with("--mount"))
                .collect::<Vec<_>>()
        })
        .find(|w| w.first() == Some(&"cargo"))
        .expect("a cargo command");
    assert_eq!(cargo[1], "build");
    assert!(cargo.contains(&"--locked"), "builds exactly Cargo.lock");
    assert!(cargo.contains(&"--release"));
    let workspace = workspace_binaries();
    let mut built = BTreeSet::new();
    let mut package: Option<&str> = None;
    let mut words = cargo.iter().skip(2);
    while let Some(w) = words.next() {
        match *w {
            "-p" | "--package" => {
                let p = words.next().unwrap();
                assert!(
                    workspace.contains_key(*p),
                    "no package {p} in the workspace"
                );
                package = Some(p);
            }
            "--bin" => {
                let b = words.next().unwrap();
                let p = package.expect("--bin after its -p");
                assert!(
                    workspace[p].contains(*b),
                    "package {p} has no binary {b} (has {:?})",
                    workspace[p]
                );
                built.insert(b.to_string());
            }
            "--release" | "--locked" => {}
            other => panic!("unexpected cargo argument {other}"),
        }
    }
    // The binaries the final stages copy out of /out are the ones built.
    let copied: BTreeSet<String> = finals(&stages)
        .iter()
        .map(|s| s.name.clone().unwrap())
        .collect();
    assert_eq!(built, copied);
    let cp = runs
        .iter()
        .flat_map(|r| r.split("&&"))
        .map(str::trim)
        .find(|c| c.starts_with("cp "))
        .expect("the binaries are copied to /out");
    for b in &built {
        assert!(
            cp.contains(&format!("target/release/{b} ")),
            "{b} is not copied to /out: {cp}"
        );
    }
}

/// Every `image:` in the YAML under `dir` (recursively).
fn images_in(dir: &Path, out: &mut BTreeMap<String, PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            images_in(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml") {
            for line in std::fs::read_to_string(&p).unwrap().lines() {
                let t = line.trim().trim_start_matches("- ");
                if let Some(img) = t.strip_prefix("image:") {
                    out.insert(img.trim().trim_matches('"').to_string(), p.clone());
                }
            }
        }
    }
}

#[test]
fn every_image_the_manifests_name_is_a_dockerfile_target() {
    let targets: BTreeSet<String> = finals(&dockerfile())
        .iter()
        .map(|s| s.name.clone().unwrap())
        .collect();
    let mut images = BTreeMap::new();
    images_in(&root().join("deploy/base"), &mut images);
    images_in(&root().join("deploy/overlays"), &mut images);
    images_in(&root().join("deploy/components"), &mut images);
    // Helm templates name the image through values; checked in deploy_render.rs.
    assert!(images.len() >= 2, "{images:?}");
    for (image, file) in &images {
        let rest = image
            .strip_prefix(REGISTRY)
            .unwrap_or_else(|| panic!("{}: {image} is not under {REGISTRY}", file.display()));
        let (target, tag) = rest.split_once(':').expect("a tag");
        assert!(!tag.is_empty());
        assert!(
            targets.contains(target),
            "{}: {image} names no Dockerfile target ({targets:?})",
            file.display()
        );
    }
    // The header's build commands tag each target with the name the manifests use.
    let text = std::fs::read_to_string(root().join("deploy/docker/Dockerfile")).unwrap();
    for t in &targets {
        assert!(
            text.contains(&format!("--target {t} -t {REGISTRY}{t}:")),
            "the Dockerfile's header has no build command for {t}"
        );
    }
}

#[test]
fn the_parser_sees_through_comments_and_continuations() {
    let s = stages(
        "ARG X=1\n# c\nFROM a AS b\nRUN x \\\n  y\nFROM gcr.io/distroless/static AS c\nCOPY --from=b /o/c /c\n",
    );
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].instructions, [("RUN".into(), "x  y".into())]);
    let f = finals(&s);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].name.as_deref(), Some("c"));
}
