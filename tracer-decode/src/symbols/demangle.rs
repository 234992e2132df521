//! Readable names of mangled C++ (Itanium ABI, `_Z…`) and Rust (`_R…` and legacy
//! `_ZN…17h<hash>E`) symbols. Names come from files other processes control: parsing and
//! printing are bounded by recursion limits and an output size, and a name that does not
//! demangle within them stays as it is.
use std::borrow::Cow;
use std::fmt::{self, Write as _};

use cpp_demangle::{DemangleOptions, ParseOptions};

/// Bytes of a demangled name. A mangled name of [`super::elf::MAX_SYMBOL_NAME_BYTES`] can expand
/// (substitutions repeat earlier parts); past this the mangled name is kept instead.
pub const MAX_DEMANGLED_BYTES: usize = 16 * 1024;
/// Nesting depth `cpp_demangle` may recurse to while parsing a name (its own default; deeper
/// names are refused rather than risk the stack).
pub const MAX_CPP_PARSE_DEPTH: u32 = 96;
/// Nesting depth while printing a parsed name (the crate's default).
pub const MAX_CPP_PRINT_DEPTH: u32 = 128;

/// `name` demangled, or `name` itself when it is not mangled or does not demangle within the
/// bounds. Rust hashes are left out (`core::ptr::drop_in_place<T>`, not `…::h0123…`).
pub fn demangle(name: &str) -> Cow<'_, str> {
    let demangled = if name.starts_with("_R") || name.starts_with("_ZN") {
        demangle_rust(name).or_else(|| demangle_cpp(name))
    } else if name.starts_with("_Z") {
        demangle_cpp(name)
    } else {
        None
    };
    demangled.map_or(Cow::Borrowed(name), Cow::Owned)
}

fn demangle_rust(name: &str) -> Option<String> {
    let symbol = rustc_demangle::try_demangle(name).ok()?;
    let mut out = BoundedString::default();
    // `{:#}` leaves the hash out; an error is the size bound (or the crate's own limits).
    write!(out, "{symbol:#}").ok()?;
    Some(out.0)
}

fn demangle_cpp(name: &str) -> Option<String> {
    let parse = ParseOptions::default().recursion_limit(MAX_CPP_PARSE_DEPTH);
    let symbol = cpp_demangle::BorrowedSymbol::new_with_options(name.as_bytes(), &parse).ok()?;
    let print = DemangleOptions::new().recursion_limit(MAX_CPP_PRINT_DEPTH);
    let mut out = BoundedString::default();
    symbol.structured_demangle(&mut out, &print).ok()?;
    Some(out.0)
}

/// A `String` that refuses to grow past [`MAX_DEMANGLED_BYTES`]: the refusal stops the printer
/// at once, so a name that expands without end costs no more than the bound.
#[derive(Default)]
struct BoundedString(String);

impl fmt::Write for BoundedString {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.0.len() + s.len() > MAX_DEMANGLED_BYTES {
            return Err(fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_names_demangle_with_their_parameters() {
        assert_eq!(demangle("_ZN5space3fooEibc"), "space::foo(int, bool, char)");
        // A libcoreclr.so-style member function.
        assert_eq!(
            demangle("_ZN6Thread23RareDisablePreemptiveGCEv"),
            "Thread::RareDisablePreemptiveGC()"
        );
        assert_eq!(demangle("_Z4mainv"), "main()");
    }

    #[test]
    fn rust_names_demangle_without_their_hash() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
    }

    #[test]
    fn plain_and_broken_names_stay_as_they_are() {
        for name in ["main", "memcpy", "_Z", "_ZN3foo", "_R", "_Zzzz", "__libc_start_main", ""] {
            assert!(matches!(demangle(name), Cow::Borrowed(n) if n == name), "{name}");
        }
    }

    #[test]
    fn a_name_that_expands_past_the_bound_stays_mangled() {
        // `B<S_n, S_n>` becomes substitution n + 1: each parameter doubles the printed name.
        let doubling = |n: usize| {
            let subs = "123456789ABCDEFGHIJ";
            let params: String = subs[..n].chars().map(|i| format!("S0_IS{i}_S{i}_E")).collect();
            format!("_Z1f1A1BIS_S_E{params}")
        };
        assert_eq!(demangle(&doubling(1)), "f(A, B<A, A>, B<B<A, A>, B<A, A> >)");
        // 223 bytes that would print 13 MB.
        let huge = doubling(19);
        assert_eq!(huge.len(), 223);
        assert_eq!(demangle(&huge), huge);
        // Nested template arguments deeper than the parse limit.
        let deep = format!("_Z1f{}i{}", "1AI".repeat(200), "E".repeat(200));
        assert_eq!(demangle(&deep), deep);
        let shallow = format!("_Z1f{}i{}", "1AI".repeat(3), "E".repeat(3));
        assert_eq!(demangle(&shallow), "f(A<A<A<int> > >)");
    }
}
