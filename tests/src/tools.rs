//! Programs and packages the tests run that `cargo xtask setup` installs outside the system's
//! paths: the npm packages of `tests/node/` (speedscope, ajv).
use std::path::PathBuf;

/// The `node_modules` directory `cargo xtask setup` fills from `tests/node/package-lock.json`:
/// `$TRACER_CACHE_DIR/node/node_modules`, else `~/.cache/tracer/node/node_modules` (xtask's
/// cache directory). Panics saying what to do when it is missing.
pub fn npm_modules() -> PathBuf {
    let cache = match std::env::var_os("TRACER_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME").expect("neither TRACER_CACHE_DIR nor HOME is set");
            PathBuf::from(home).join(".cache/tracer")
        }
    };
    let modules = cache.join("node/node_modules");
    assert!(
        modules.join("speedscope").is_dir() && modules.join("ajv").is_dir(),
        "{} lacks speedscope or ajv: run `cargo xtask setup` (it installs tests/node's npm \
         packages there)",
        modules.display()
    );
    modules
}
