//! C helpers (`tests/native/*.c`) compiled for a test into a scratch directory: code whose
//! machine-level shape the test relies on (frame pointers, which function spins), which Rust
//! does not promise.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::scratch::ScratchDir;

/// `gcc` flags of every helper: a frame-pointer chain through its functions, so the kernel can
/// walk each user stack (GCC 12 still leaves leaf functions without a frame: a helper whose
/// samples need their caller calls something).
const CFLAGS: [&str; 3] = ["-O1", "-fno-omit-frame-pointer", "-pthread"];

/// A compiled helper; its directory goes when it is dropped.
pub struct NativeHelper {
    _dir: ScratchDir,
    path: PathBuf,
}

impl NativeHelper {
    /// Compiles `tests/native/<name>.c`; panics saying what to install when gcc is missing,
    /// or with gcc's errors.
    pub fn compile(name: &str) -> NativeHelper {
        let dir = ScratchDir::new(name);
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("native").join(format!("{name}.c"));
        let path = dir.path().join(name);
        let output = Command::new("gcc")
            .args(CFLAGS)
            .arg("-o")
            .arg(&path)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "running gcc to compile {}: {e} (install it: apt-get install gcc)",
                    source.display()
                )
            });
        assert!(
            output.status.success(),
            "gcc failed on {}:\n{}",
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        NativeHelper { _dir: dir, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size of function `name` in the binary (`nm -S`).
    pub fn function_size(&self, name: &str) -> u64 {
        let output = Command::new("nm").arg("-S").arg(&self.path).output().unwrap_or_else(|e| {
            panic!(
                "running nm on {}: {e} (install binutils: apt-get install binutils)",
                self.path.display()
            )
        });
        assert!(output.status.success(), "nm failed: {}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8(output.stdout).expect("nm prints text");
        text.lines()
            .find_map(|line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [_address, size, "T" | "t", symbol] if symbol == name => {
                    u64::from_str_radix(size, 16).ok()
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("nm -S lists no function {name} in {}", self.path.display()))
    }
}
