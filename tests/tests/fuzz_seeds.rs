//! The committed fuzz seeds are exactly what `tests::fuzz_seeds` generates from the fixtures
//! (regenerate with `cargo run -p tests --bin fuzz_seeds`), and the copied IPC replies decode.
use std::collections::BTreeMap;
use std::fs;

use tests::fuzz_seeds::{self, EXTENSION, GENERATED_TARGETS, check_ipc_reply_seed};

/// (target, file name) → bytes of the committed seeds of `targets`.
fn committed(targets: &[&str]) -> BTreeMap<(String, String), Vec<u8>> {
    let mut seeds = BTreeMap::new();
    for target in targets {
        let dir = fuzz_seeds::corpus_dir().join(target);
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == EXTENSION) {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                seeds.insert(((*target).to_owned(), name), fs::read(&path).unwrap());
            }
        }
    }
    seeds
}

#[test]
fn committed_seeds_are_the_generated_ones() {
    let generated: BTreeMap<(String, String), Vec<u8>> = fuzz_seeds::generated()
        .into_iter()
        .map(|s| ((s.target.to_owned(), s.name), s.bytes))
        .collect();
    let committed = committed(&GENERATED_TARGETS);
    let names = |m: &BTreeMap<(String, String), Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&committed), names(&generated), "run `cargo run -p tests --bin fuzz_seeds`");
    for (key, bytes) in &generated {
        assert!(
            committed[key] == *bytes,
            "{key:?} differs: run `cargo run -p tests --bin fuzz_seeds`"
        );
    }
    // Every generated target has seeds.
    for target in GENERATED_TARGETS {
        assert!(committed.keys().any(|(t, _)| t == target), "no seed for {target}");
    }
}

#[test]
fn copied_ipc_replies_decode_as_what_they_answered() {
    let seeds = committed(&["ipc_reply"]);
    assert_eq!(seeds.len(), 7, "the seven captured replies of CoreCLR 8.0.4");
    for ((_, name), bytes) in &seeds {
        check_ipc_reply_seed(name, bytes);
    }
}
