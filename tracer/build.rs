//! Builds the eBPF object (tracer-ebpf) with aya-build on the nightly toolchain and places it in
//! OUT_DIR for `include_bytes_aligned!`. A failed eBPF build fails this build: tracer never embeds
//! a stale or empty object.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    if std::env::var_os("AYA_BUILD_SKIP").is_some() {
        return Err(anyhow!(
            "AYA_BUILD_SKIP is set, but tracer embeds its eBPF object and cannot be built without it"
        ));
    }
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir).join("../tracer-ebpf");
    let ebpf_dir = ebpf_dir.canonicalize().with_context(|| format!("{}", ebpf_dir.display()))?;
    let root_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [aya_build::Package { name: "tracer-ebpf", root_dir, ..Default::default() }],
        aya_build::Toolchain::Nightly,
    )
    .context("building the eBPF programs (needs nightly + rust-src and bpf-linker: run `cargo xtask setup`)")
}
