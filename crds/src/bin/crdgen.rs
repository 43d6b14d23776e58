//! Writes the CRD YAML to `deploy/crds/` (or the directory given as the first argument).

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds"));
    crds::crdgen::write_all(&dir)?;
    eprintln!("wrote CRDs to {}", dir.display());
    Ok(())
}
