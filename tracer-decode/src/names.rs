//! Symbolic names for the flag words and error numbers the detection events carry (Linux x86_64
//! values), so output says `PROT_READ|PROT_WRITE` and `ENOTTY` instead of bare numbers.
//!
//! Unknown bits are never dropped: they are appended as a hex remainder (`PROT_READ|0x80`).

const PROT_FLAGS: &[(u64, &str)] = &[
    (0x1, "PROT_READ"),
    (0x2, "PROT_WRITE"),
    (0x4, "PROT_EXEC"),
    (0x8, "PROT_SEM"),
    (0x0100_0000, "PROT_GROWSDOWN"),
    (0x0200_0000, "PROT_GROWSUP"),
];

/// `MAP_*` bits outside the mapping-type field (`MAP_TYPE` = 0x0f).
const MAP_FLAGS: &[(u64, &str)] = &[
    (0x10, "MAP_FIXED"),
    (0x20, "MAP_ANONYMOUS"),
    (0x40, "MAP_32BIT"),
    (0x100, "MAP_GROWSDOWN"),
    (0x800, "MAP_DENYWRITE"),
    (0x1000, "MAP_EXECUTABLE"),
    (0x2000, "MAP_LOCKED"),
    (0x4000, "MAP_NORESERVE"),
    (0x8000, "MAP_POPULATE"),
    (0x1_0000, "MAP_NONBLOCK"),
    (0x2_0000, "MAP_STACK"),
    (0x4_0000, "MAP_HUGETLB"),
    (0x8_0000, "MAP_SYNC"),
    (0x10_0000, "MAP_FIXED_NOREPLACE"),
    (0x400_0000, "MAP_UNINITIALIZED"),
];
const MAP_TYPE_MASK: u64 = 0x0f;

const MFD_FLAGS: &[(u64, &str)] = &[
    (0x1, "MFD_CLOEXEC"),
    (0x2, "MFD_ALLOW_SEALING"),
    (0x4, "MFD_HUGETLB"),
    (0x8, "MFD_NOEXEC_SEAL"),
    (0x10, "MFD_EXEC"),
];

const CLONE_FLAGS: &[(u64, &str)] = &[
    (0x100, "CLONE_VM"),
    (0x200, "CLONE_FS"),
    (0x400, "CLONE_FILES"),
    (0x800, "CLONE_SIGHAND"),
    (0x1000, "CLONE_PIDFD"),
    (0x2000, "CLONE_PTRACE"),
    (0x4000, "CLONE_VFORK"),
    (0x8000, "CLONE_PARENT"),
    (0x1_0000, "CLONE_THREAD"),
    (0x2_0000, "CLONE_NEWNS"),
    (0x4_0000, "CLONE_SYSVSEM"),
    (0x8_0000, "CLONE_SETTLS"),
    (0x10_0000, "CLONE_PARENT_SETTID"),
    (0x20_0000, "CLONE_CHILD_CLEARTID"),
    (0x40_0000, "CLONE_DETACHED"),
    (0x80_0000, "CLONE_UNTRACED"),
    (0x100_0000, "CLONE_CHILD_SETTID"),
    (0x200_0000, "CLONE_NEWCGROUP"),
    (0x400_0000, "CLONE_NEWUTS"),
    (0x800_0000, "CLONE_NEWIPC"),
    (0x1000_0000, "CLONE_NEWUSER"),
    (0x2000_0000, "CLONE_NEWPID"),
    (0x4000_0000, "CLONE_NEWNET"),
    (0x8000_0000, "CLONE_IO"),
    (0x1_0000_0000, "CLONE_CLEAR_SIGHAND"),
    (0x2_0000_0000, "CLONE_INTO_CGROUP"),
];
/// `CSIGNAL`: the low byte of the clone flags is the signal sent to the parent on exit.
const CSIGNAL: u64 = 0xff;
const SIGCHLD: u64 = 17;

/// Joins the names of the bits of `value` found in `table`, then any remaining bits in hex.
fn bit_names(value: u64, table: &[(u64, &str)], mut parts: Vec<String>) -> String {
    let mut rest = value;
    for &(bit, name) in table {
        if value & bit != 0 {
            parts.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("{rest:#x}"));
    }
    if parts.is_empty() { "0".to_string() } else { parts.join("|") }
}

/// `PROT_*` bits; 0 is `PROT_NONE`.
pub fn prot_names(prot: u64) -> String {
    if prot == 0 {
        return "PROT_NONE".to_string();
    }
    bit_names(prot, PROT_FLAGS, Vec::new())
}

/// `MAP_*` flags: the mapping type (`MAP_SHARED`, `MAP_PRIVATE`, `MAP_SHARED_VALIDATE`) first.
pub fn map_flag_names(flags: u64) -> String {
    let map_type = match flags & MAP_TYPE_MASK {
        0 => None,
        1 => Some("MAP_SHARED".to_string()),
        2 => Some("MAP_PRIVATE".to_string()),
        3 => Some("MAP_SHARED_VALIDATE".to_string()),
        other => Some(format!("MAP_TYPE({other:#x})")),
    };
    bit_names(flags & !MAP_TYPE_MASK, MAP_FLAGS, map_type.into_iter().collect())
}

/// `memfd_create` `MFD_*` flags; 0 is `"0"`.
pub fn memfd_flag_names(flags: u64) -> String {
    bit_names(flags, MFD_FLAGS, Vec::new())
}

/// `clone` flags with the exit signal of the low byte (`SIGCHLD` for `fork()`).
pub fn clone_flag_names(flags: u64) -> String {
    let signal = match flags & CSIGNAL {
        0 => None,
        SIGCHLD => Some("SIGCHLD".to_string()),
        sig => Some(format!("signal {sig}")),
    };
    let mut names = bit_names(flags & !CSIGNAL, CLONE_FLAGS, Vec::new());
    if let Some(signal) = signal {
        names = if names == "0" { signal } else { format!("{names}|{signal}") };
    }
    names
}

/// Linux (x86_64, asm-generic) errno names by number; index = errno.
const ERRNO_NAMES: [&str; 134] = [
    "",
    "EPERM",
    "ENOENT",
    "ESRCH",
    "EINTR",
    "EIO",
    "ENXIO",
    "E2BIG",
    "ENOEXEC",
    "EBADF", // 0
    "ECHILD",
    "EAGAIN",
    "ENOMEM",
    "EACCES",
    "EFAULT",
    "ENOTBLK",
    "EBUSY",
    "EEXIST",
    "EXDEV",
    "ENODEV", // 10
    "ENOTDIR",
    "EISDIR",
    "EINVAL",
    "ENFILE",
    "EMFILE",
    "ENOTTY",
    "ETXTBSY",
    "EFBIG",
    "ENOSPC",
    "ESPIPE", // 20
    "EROFS",
    "EMLINK",
    "EPIPE",
    "EDOM",
    "ERANGE",
    "EDEADLK",
    "ENAMETOOLONG",
    "ENOLCK",
    "ENOSYS",
    "ENOTEMPTY", // 30
    "ELOOP",
    "",
    "ENOMSG",
    "EIDRM",
    "ECHRNG",
    "EL2NSYNC",
    "EL3HLT",
    "EL3RST",
    "ELNRNG",
    "EUNATCH", // 40
    "ENOCSI",
    "EL2HLT",
    "EBADE",
    "EBADR",
    "EXFULL",
    "ENOANO",
    "EBADRQC",
    "EBADSLT",
    "",
    "EBFONT", // 50
    "ENOSTR",
    "ENODATA",
    "ETIME",
    "ENOSR",
    "ENONET",
    "ENOPKG",
    "EREMOTE",
    "ENOLINK",
    "EADV",
    "ESRMNT", // 60
    "ECOMM",
    "EPROTO",
    "EMULTIHOP",
    "EDOTDOT",
    "EBADMSG",
    "EOVERFLOW",
    "ENOTUNIQ",
    "EBADFD",
    "EREMCHG",
    "ELIBACC", // 70
    "ELIBBAD",
    "ELIBSCN",
    "ELIBMAX",
    "ELIBEXEC",
    "EILSEQ",
    "ERESTART",
    "ESTRPIPE",
    "EUSERS",
    "ENOTSOCK",
    "EDESTADDRREQ", // 80
    "EMSGSIZE",
    "EPROTOTYPE",
    "ENOPROTOOPT",
    "EPROTONOSUPPORT",
    "ESOCKTNOSUPPORT",
    "EOPNOTSUPP",
    "EPFNOSUPPORT",
    "EAFNOSUPPORT",
    "EADDRINUSE",
    "EADDRNOTAVAIL", // 90
    "ENETDOWN",
    "ENETUNREACH",
    "ENETRESET",
    "ECONNABORTED",
    "ECONNRESET",
    "ENOBUFS",
    "EISCONN",
    "ENOTCONN",
    "ESHUTDOWN",
    "ETOOMANYREFS", // 100
    "ETIMEDOUT",
    "ECONNREFUSED",
    "EHOSTDOWN",
    "EHOSTUNREACH",
    "EALREADY",
    "EINPROGRESS",
    "ESTALE",
    "EUCLEAN",
    "ENOTNAM",
    "ENAVAIL", // 110
    "EISNAM",
    "EREMOTEIO",
    "EDQUOT",
    "ENOMEDIUM",
    "EMEDIUMTYPE",
    "ECANCELED",
    "ENOKEY",
    "EKEYEXPIRED",
    "EKEYREVOKED",
    "EKEYREJECTED", // 120
    "EOWNERDEAD",
    "ENOTRECOVERABLE",
    "ERFKILL",
    "EHWPOISON", // 130
];

/// Name of a positive errno (`25` → `ENOTTY`); `None` for numbers Linux does not define.
pub fn errno_name(errno: u64) -> Option<&'static str> {
    let name = *ERRNO_NAMES.get(usize::try_from(errno).ok()?)?;
    (!name.is_empty()).then_some(name)
}

/// Name of the error in a syscall return value (`-25` → `Some("ENOTTY")`); `None` for success.
/// A negative value Linux does not name becomes `E<n>` so it is still visibly an error.
pub fn syscall_error_name(ret: i64) -> Option<String> {
    if ret >= 0 {
        return None;
    }
    let errno = ret.unsigned_abs();
    Some(errno_name(errno).map_or_else(|| format!("E{errno}"), str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prot() {
        assert_eq!(prot_names(0), "PROT_NONE");
        assert_eq!(prot_names(3), "PROT_READ|PROT_WRITE");
        assert_eq!(prot_names(5), "PROT_READ|PROT_EXEC");
        assert_eq!(prot_names(0x81), "PROT_READ|0x80");
    }

    #[test]
    fn map_flags() {
        assert_eq!(map_flag_names(libc::MAP_PRIVATE as u64), "MAP_PRIVATE");
        assert_eq!(
            map_flag_names((libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE) as u64),
            "MAP_SHARED|MAP_FIXED|MAP_POPULATE"
        );
        assert_eq!(map_flag_names(0x22), "MAP_PRIVATE|MAP_ANONYMOUS");
        assert_eq!(map_flag_names(0x3), "MAP_SHARED_VALIDATE");
        assert_eq!(map_flag_names(0x2 | 0x8000_0000), "MAP_PRIVATE|0x80000000");
        for &(bit, name) in MAP_FLAGS {
            let libc_value = match name {
                "MAP_FIXED" => libc::MAP_FIXED,
                "MAP_ANONYMOUS" => libc::MAP_ANONYMOUS,
                "MAP_32BIT" => libc::MAP_32BIT,
                "MAP_GROWSDOWN" => libc::MAP_GROWSDOWN,
                "MAP_DENYWRITE" => libc::MAP_DENYWRITE,
                "MAP_EXECUTABLE" => libc::MAP_EXECUTABLE,
                "MAP_LOCKED" => libc::MAP_LOCKED,
                "MAP_NORESERVE" => libc::MAP_NORESERVE,
                "MAP_POPULATE" => libc::MAP_POPULATE,
                "MAP_NONBLOCK" => libc::MAP_NONBLOCK,
                "MAP_STACK" => libc::MAP_STACK,
                "MAP_HUGETLB" => libc::MAP_HUGETLB,
                "MAP_SYNC" => libc::MAP_SYNC,
                "MAP_FIXED_NOREPLACE" => libc::MAP_FIXED_NOREPLACE,
                "MAP_UNINITIALIZED" => 0x400_0000,
                other => panic!("untested flag {other}"),
            };
            assert_eq!(bit, libc_value as u64, "{name}");
        }
    }

    #[test]
    fn memfd_and_clone_flags() {
        assert_eq!(memfd_flag_names(0), "0");
        assert_eq!(
            memfd_flag_names((libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64),
            "MFD_CLOEXEC|MFD_ALLOW_SEALING"
        );
        assert_eq!(clone_flag_names(libc::SIGCHLD as u64), "SIGCHLD");
        assert_eq!(
            clone_flag_names((libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64),
            "CLONE_VM|CLONE_VFORK|SIGCHLD"
        );
        assert_eq!(
            clone_flag_names(0x0001_0000 | 0x0f00),
            "CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD"
        );
        assert_eq!(clone_flag_names(0), "0");
        assert_eq!(clone_flag_names(9), "signal 9");
        assert_eq!(clone_flag_names(libc::CLONE_THREAD as u64), "CLONE_THREAD");
    }

    #[test]
    fn errno_names_match_libc() {
        let known = [
            (libc::EPERM, "EPERM"),
            (libc::ENOENT, "ENOENT"),
            (libc::EBADF, "EBADF"),
            (libc::EAGAIN, "EAGAIN"),
            (libc::EFAULT, "EFAULT"),
            (libc::EBUSY, "EBUSY"),
            (libc::EINVAL, "EINVAL"),
            (libc::EMFILE, "EMFILE"),
            (libc::ENOTTY, "ENOTTY"),
            (libc::E2BIG, "E2BIG"),
            (libc::ENOSYS, "ENOSYS"),
            (libc::ELOOP, "ELOOP"),
            (libc::ENOMSG, "ENOMSG"),
            (libc::EBFONT, "EBFONT"),
            (libc::ENOSTR, "ENOSTR"),
            (libc::EOVERFLOW, "EOVERFLOW"),
            (libc::ENOTSOCK, "ENOTSOCK"),
            (libc::EOPNOTSUPP, "EOPNOTSUPP"),
            (libc::EADDRINUSE, "EADDRINUSE"),
            (libc::ETIMEDOUT, "ETIMEDOUT"),
            (libc::ECONNREFUSED, "ECONNREFUSED"),
            (libc::EDQUOT, "EDQUOT"),
            (libc::ECANCELED, "ECANCELED"),
            (libc::EKEYREJECTED, "EKEYREJECTED"),
            (libc::EOWNERDEAD, "EOWNERDEAD"),
            (libc::EHWPOISON, "EHWPOISON"),
        ];
        for (value, name) in known {
            assert_eq!(errno_name(value as u64), Some(name), "errno {value}");
        }
        // Every named entry sits at its libc value: spot-check the whole table's alignment
        // through strerror-independent constants at each decade boundary.
        for (value, name) in [
            (libc::ECHILD, "ECHILD"),
            (libc::ENOTDIR, "ENOTDIR"),
            (libc::EROFS, "EROFS"),
            (libc::ENOCSI, "ENOCSI"),
            (libc::ECOMM, "ECOMM"),
            (libc::ELIBBAD, "ELIBBAD"),
            (libc::EMSGSIZE, "EMSGSIZE"),
            (libc::ENETDOWN, "ENETDOWN"),
            (libc::EISNAM, "EISNAM"),
        ] {
            assert_eq!(errno_name(value as u64), Some(name), "errno {value}");
        }
        assert_eq!(errno_name(0), None);
        assert_eq!(errno_name(41), None);
        assert_eq!(errno_name(134), None);
    }

    #[test]
    fn syscall_errors() {
        assert_eq!(syscall_error_name(0), None);
        assert_eq!(syscall_error_name(3), None);
        assert_eq!(syscall_error_name(-25).as_deref(), Some("ENOTTY"));
        assert_eq!(syscall_error_name(-4000).as_deref(), Some("E4000"));
        assert_eq!(syscall_error_name(i64::MIN).as_deref(), Some("E9223372036854775808"));
    }
}
