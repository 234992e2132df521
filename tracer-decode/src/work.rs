//! A count of the work decoders do, for the unit tests that hold them to a linear amount per
//! input byte (docs/security.md: work is bounded by what a peer sends). Wall-clock time cannot
//! show that on a loaded machine; this count is the same on every run.
//!
//! Decoders add the bytes they read, copy or charge at the places that loop over input:
//! header bytes looked at to find a unit, bytes buffered, bytes of a unit walked, payload
//! decoding cost. Outside the tests [`count`] compiles to nothing.

#[cfg(test)]
std::thread_local! {
    static UNITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Adds `units` to this thread's count (tests only).
#[inline(always)]
pub(crate) fn count(units: usize) {
    #[cfg(test)]
    UNITS.with(|total| total.set(total.get() + units as u64));
    #[cfg(not(test))]
    let _ = units;
}

/// Runs `f` and returns its result with the work it counted on this thread.
#[cfg(test)]
pub(crate) fn measure<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = UNITS.with(std::cell::Cell::get);
    let result = f();
    (result, UNITS.with(std::cell::Cell::get) - before)
}

/// An input whose work per byte passes this many times the median of its fuzz target's seeds
/// is a decoder bug (fuzz/README.md).
#[cfg(test)]
pub(crate) const OVER_MEDIAN_MAX: u64 = 100;

/// The committed seeds of fuzz target `target` (`fuzz/corpus/<target>/*.seed`, each in the
/// target's input format), sorted by name.
#[cfg(test)]
pub(crate) fn fuzz_seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = format!("{}/../fuzz/corpus/{target}", env!("CARGO_MANIFEST_DIR"));
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "seed"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    seeds.sort();
    seeds
}

/// Checks runs of (what ran, work, input bytes): each within [`OVER_MEDIAN_MAX`] times the
/// median work per byte, and within `max_per_byte`.
#[cfg(test)]
pub(crate) fn assert_linear(runs: &[(String, u64, usize)], max_per_byte: u64) {
    // Thousandths of a unit per byte: integers, so the check is exact.
    let per_byte: Vec<u64> =
        runs.iter().map(|(_, work, bytes)| work * 1000 / (*bytes).max(1) as u64).collect();
    let mut sorted = per_byte.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    for ((run, ..), per_byte) in runs.iter().zip(&per_byte) {
        assert!(*per_byte <= OVER_MEDIAN_MAX * median, "{run}: {per_byte} vs median {median}");
        assert!(*per_byte <= max_per_byte * 1000, "{run}: {per_byte}/1000 a byte: {runs:?}");
    }
}
