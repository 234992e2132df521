//! Rebuild the eBPF object when the linker changes: bpf-linker is not tracked by cargo.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => println!("cargo:warning=bpf-linker not found ({e}); run `cargo xtask setup`"),
    }
}
