//! Rewrites the generated fuzz seeds (`fuzz/corpus/<target>/*.seed`, see `tests::fuzz_seeds`):
//! `cargo run -p tests --bin fuzz_seeds`. Seeds no longer generated are removed.
use std::fs;

use anyhow::{Context, Result};
use tests::fuzz_seeds::{self, EXTENSION, GENERATED_TARGETS};

fn main() -> Result<()> {
    let corpus = fuzz_seeds::corpus_dir();
    for target in GENERATED_TARGETS {
        let dir = corpus.join(target);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == EXTENSION) {
                fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    let seeds = fuzz_seeds::generated();
    for seed in &seeds {
        let path = corpus.join(seed.target).join(&seed.name);
        fs::write(&path, &seed.bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("wrote {} seeds under {}", seeds.len(), corpus.display());
    Ok(())
}
