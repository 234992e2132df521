//! Clock reads, and the mapping of kernel CLOCK_MONOTONIC nanoseconds (BPF `bpf_ktime_get_ns`,
//! ftrace `trace_clock=mono`, nettrace timestamps on Linux) to wall-clock time for the `ts` field
//! of every output line; and [`PeriodicTimer`], the clock the always-attached readers wait on.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracer_decode::json;

/// A `CLOCK_MONOTONIC` timerfd that expires every `period`, waited on in tokio's epoll set.
///
/// The readers that stay attached (the ftrace consumer's poll interval, the detector's lazy
/// drain) wake every 100 ms for as long as tracer runs, so what one wake costs is paid ten
/// times a second on every host. A tokio timer costs about twice a timerfd per wake: its wheel
/// wakes the runtime at a slot boundary and again for the rest, and each timer wake adds an
/// eventfd write and one more `epoll_wait` (docs/protocol/ftrace.md §10). A periodic timerfd
/// is one kernel timer, one readable fd, one 8-byte `read`.
///
/// The schedule is fixed: expirations missed while the owner was busy are merged into one
/// tick, not replayed (the kernel counts them; tracer only needs "at least one passed").
pub struct PeriodicTimer {
    fd: AsyncFd<OwnedFd>,
}

impl PeriodicTimer {
    /// Starts a timer whose first tick comes one `period` from now. Must be called inside a
    /// tokio runtime; a zero period is refused (a timerfd would never fire).
    pub fn new(period: Duration) -> io::Result<PeriodicTimer> {
        if period.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a periodic timer needs a period above zero",
            ));
        }
        // SAFETY: plain syscall with constant flags; the fd it returns is owned below.
        let raw = unsafe {
            libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new, valid fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let every = libc::timespec {
            // Periods beyond time_t are "never" in practice: saturate rather than wrap.
            tv_sec: libc::time_t::try_from(period.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: period.subsec_nanos().into(),
        };
        let spec = libc::itimerspec { it_interval: every, it_value: every };
        // SAFETY: `fd` is a timerfd; `spec` is a valid itimerspec; no old value is asked for.
        if unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the OwnedFd stays open, unchanged, for the AsyncFd's whole life.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(PeriodicTimer { fd })
    }

    /// Waits for the next expiration (returns at once if one passed since the last tick).
    /// Cancel-safe: dropping the future loses no expiration.
    pub async fn tick(&self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let read = guard.try_io(|fd| {
                let mut expirations = [0u8; 8];
                // SAFETY: reads 8 bytes into a local 8-byte buffer from a timerfd it owns.
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
                if n < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
            });
            match read {
                Ok(result) => return result,
                // Readiness was stale (EAGAIN): try_io cleared it; wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

/// Wall-clock = monotonic + offset, with the offset sampled once at start-up so every source
/// shares one conversion (and lines from different sources sort consistently). Process starts
/// (`process_start_ns`) are CLOCK_BOOTTIME, converted with an offset of their own.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// realtime_ns − monotonic_ns at start-up.
    offset_ns: i128,
    /// realtime_ns − boottime_ns at start-up.
    boot_offset_ns: i128,
}

impl Clock {
    /// Samples both clocks now.
    pub fn new() -> Clock {
        // Bracket the realtime read between two monotonic reads and use their midpoint.
        let m1 = monotonic_ns();
        let r = realtime_ns();
        let m2 = monotonic_ns();
        let mid = (m1 as i128 + m2 as i128) / 2;
        let (b1, boot_r, b2) = (boottime_ns(), realtime_ns(), boottime_ns());
        let boot_mid = (b1 as i128 + b2 as i128) / 2;
        Clock { offset_ns: r as i128 - mid, boot_offset_ns: boot_r as i128 - boot_mid }
    }

    /// A clock with a fixed offset, the same for both clocks (tests).
    pub fn with_offset(offset_ns: i128) -> Clock {
        Clock { offset_ns, boot_offset_ns: offset_ns }
    }

    /// Wall-clock nanoseconds since the Unix epoch for a CLOCK_BOOTTIME time.
    pub fn wall_of_boottime_ns(&self, boot_ns: u64) -> i128 {
        boot_ns as i128 + self.boot_offset_ns
    }

    /// Wall-clock nanoseconds since the Unix epoch for a monotonic timestamp.
    pub fn wall_ns(&self, mono_ns: u64) -> i128 {
        mono_ns as i128 + self.offset_ns
    }

    /// ISO-8601 UTC with nanoseconds, e.g. `2026-11-29T22:30:00.123456789Z`.
    pub fn iso8601(&self, mono_ns: u64) -> String {
        format_iso8601(self.wall_ns(mono_ns))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Sleeps until `deadline`; without one, never wakes (a `select!` arm that is off).
pub async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

/// CLOCK_BOOTTIME nanoseconds (the clock processes' starts are kept in), now.
pub fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME) as u64
}

/// Wall-clock nanoseconds since the Unix epoch, now.
pub fn realtime_ns() -> i64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// [`realtime_ns`] as OTLP's unsigned Unix nanoseconds (0 before the epoch).
pub fn realtime_unix_ns() -> u64 {
    u64::try_from(realtime_ns()).unwrap_or(0)
}

fn clock_ns(id: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Formats nanoseconds since the epoch as ISO-8601 UTC (proleptic Gregorian calendar).
pub fn format_iso8601(epoch_ns: i128) -> String {
    let mut text = Vec::with_capacity(30);
    write_iso8601(&mut text, epoch_ns);
    String::from_utf8(text).expect("digits and separators are ASCII")
}

/// Appends nanoseconds since the epoch as ISO-8601 UTC, e.g. `2026-11-29T22:30:00.123456789Z`:
/// the `ts` of every line, written without a `String` of its own. Inlined for the common case
/// (after 1970, in the second of the line before): a copy and the nanoseconds' digits.
#[inline]
pub fn write_iso8601(out: &mut Vec<u8>, epoch_ns: i128) {
    const NS: u64 = 1_000_000_000;
    if let Ok(ns) = u64::try_from(epoch_ns) {
        let (secs, nanos) = ((ns / NS) as i64, (ns % NS) as u32);
        let (cached_secs, prefix) = LAST_SECOND.get();
        if cached_secs == secs {
            out.extend_from_slice(&prefix);
            write_nanos(out, nanos);
            return;
        }
    }
    write_iso8601_uncached(out, epoch_ns);
}

/// [`write_iso8601`] of a second other than the last one written (which it then keeps).
#[inline(never)]
fn write_iso8601_uncached(out: &mut Vec<u8>, epoch_ns: i128) {
    const NS: i64 = 1_000_000_000;
    // 64-bit division where it fits (until 2262): a 128-bit one costs a library call.
    let (secs, nanos) = match i64::try_from(epoch_ns) {
        Ok(ns) => (ns.div_euclid(NS), ns.rem_euclid(NS) as u32),
        Err(_) => (epoch_ns.div_euclid(NS.into()) as i64, epoch_ns.rem_euclid(NS.into()) as u32),
    };
    let start = out.len();
    write_up_to_second(out, secs);
    // Four-digit years (every clock but one far off) have a 20-byte prefix.
    if let Ok(prefix) = out[start..].try_into() {
        LAST_SECOND.set((secs, prefix));
    }
    write_nanos(out, nanos);
}

/// The nine digits of the nanoseconds and the `Z`, in one store.
#[inline]
fn write_nanos(out: &mut Vec<u8>, nanos: u32) {
    let mut tail = [0u8; 10];
    tail[0] = b'0' + (nanos / 100_000_000) as u8;
    tail[1..9].copy_from_slice(&json::ascii_digits(nanos % 100_000_000));
    tail[9] = b'Z';
    out.extend_from_slice(&tail);
}

thread_local! {
    /// The second [`write_iso8601`] wrote last and its text up to the `.`: events come in time
    /// order, so most lines share their second with the one before and only their nanoseconds
    /// are formatted.
    static LAST_SECOND: Cell<(i64, [u8; 20])> = const { Cell::new((i64::MIN, [0; 20])) };
}

/// `YYYY-MM-DDTHH:MM:SS.` of a second since the epoch.
fn write_up_to_second(out: &mut Vec<u8>, secs: i64) {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400) as u32;
    let (y, m, d) = civil_from_days(days);
    match u32::try_from(y) {
        Ok(year @ 0..=9999) => push_digits(out, year, 4),
        // Outside four digits (a clock far off): as `{:04}` writes it.
        _ => out.extend_from_slice(format!("{y:04}").as_bytes()),
    }
    out.push(b'-');
    push_digits(out, m, 2);
    out.push(b'-');
    push_digits(out, d, 2);
    out.push(b'T');
    push_digits(out, sod / 3600, 2);
    out.push(b':');
    push_digits(out, (sod / 60) % 60, 2);
    out.push(b':');
    push_digits(out, sod % 60, 2);
    out.push(b'.');
}

/// Appends the last `width` decimal digits of `value`, zero-padded.
fn push_digits(out: &mut Vec<u8>, mut value: u32, width: usize) {
    let mut digits = [b'0'; 9];
    for digit in digits[..width].iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
    out.extend_from_slice(&digits[..width]);
}

/// Nanoseconds since the epoch as the eight UTC fields a NetTrace Trace object starts with:
/// year, month, day of week (0 = Sunday), day, hour, minute, second, millisecond.
pub fn utc_fields(epoch_ns: i128) -> [u16; 8] {
    let secs = epoch_ns.div_euclid(1_000_000_000) as i64;
    let millis = (epoch_ns.rem_euclid(1_000_000_000) / 1_000_000) as u16;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 4).rem_euclid(7) as u16;
    let [h, min, sec] = [sod / 3600, (sod / 60) % 60, sod % 60].map(|v| v as u16);
    [y as u16, m as u16, weekday, d as u16, h, min, sec, millis]
}

/// The eight UTC fields of a NetTrace Trace object ([`utc_fields`]) as nanoseconds since the
/// epoch; `None` when they name no date (a month of 13, an hour of 24, …). The day of week is
/// not checked: it follows from the date.
pub fn epoch_ns_of_utc_fields(fields: [u16; 8]) -> Option<i128> {
    let [year, month, _, day, hour, minute, second, millis] = fields.map(i64::from);
    let valid = (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && hour < 24
        && minute < 60
        && second < 60
        && millis < 1000;
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    valid.then(|| i128::from(seconds) * 1_000_000_000 + i128::from(millis) * 1_000_000)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// (year, month, day) → days since 1970-01-01; Howard Hinnant's days_from_civil.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 → (year, month, day); Howard Hinnant's civil_from_days.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_periodic_timer_ticks_once_per_period_and_merges_missed_ones() {
        const PERIOD: Duration = Duration::from_millis(100);
        let timer = PeriodicTimer::new(PERIOD).unwrap();
        let start = std::time::Instant::now();
        timer.tick().await.unwrap();
        assert!(start.elapsed() >= PERIOD, "first tick after {:?}", start.elapsed());
        // Two and a half periods missed while busy come out as one tick, at once...
        std::thread::sleep(PERIOD * 5 / 2);
        let pending = |timer: &PeriodicTimer| {
            let mut tick = std::pin::pin!(timer.tick());
            let waker = std::task::Waker::noop();
            tick.as_mut().poll(&mut std::task::Context::from_waker(waker)).is_pending()
        };
        assert!(!pending(&timer), "an expiration passed while busy ticks at once");
        // ...and no more until the next expiration of the schedule.
        assert!(pending(&timer), "missed expirations are merged into one tick");
        timer.tick().await.unwrap();
    }

    #[tokio::test]
    async fn a_zero_period_is_refused() {
        let err = PeriodicTimer::new(Duration::ZERO).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(err.to_string(), "a periodic timer needs a period above zero");
    }

    #[test]
    fn formats_epoch_and_known_dates() {
        assert_eq!(format_iso8601(0), "1970-01-01T00:00:00.000000000Z");
        // 2000-02-29 (leap day) 12:34:56.000000789
        assert_eq!(format_iso8601(951_827_696_000_000_789), "2000-02-29T12:34:56.000000789Z");
        // 2026-11-29T22:30:00Z
        assert_eq!(format_iso8601(1_795_991_400_000_000_000), "2026-11-29T22:30:00.000000000Z");
        assert_eq!(format_iso8601(-1), "1969-12-31T23:59:59.999999999Z");
        // Years outside 0000–9999 as `{:04}` writes them.
        assert_eq!(format_iso8601(-62_167_219_200_000_000_001), "-001-12-31T23:59:59.999999999Z");
        assert_eq!(format_iso8601(253_402_300_800_000_000_000), "10000-01-01T00:00:00.000000000Z");
        // The same second again (its cached text), and the next.
        assert_eq!(format_iso8601(1_795_991_400_999_999_999), "2026-11-29T22:30:00.999999999Z");
        assert_eq!(format_iso8601(1_795_991_401_000_000_000), "2026-11-29T22:30:01.000000000Z");
        // Every digit position of the nanoseconds.
        assert_eq!(format_iso8601(1_795_991_401_123_456_789), "2026-11-29T22:30:01.123456789Z");
        assert_eq!(format_iso8601(1_795_991_401_987_654_320), "2026-11-29T22:30:01.987654320Z");
        assert_eq!(format_iso8601(1_795_991_401_100_000_001), "2026-11-29T22:30:01.100000001Z");
    }

    #[test]
    fn utc_fields_name_the_weekday() {
        assert_eq!(utc_fields(0), [1970, 1, 4, 1, 0, 0, 0, 0]);
        // 2026-11-29T22:30:00.250Z was a Sunday.
        assert_eq!(utc_fields(1_795_991_400_250_000_000), [2026, 11, 0, 29, 22, 30, 0, 250]);
    }

    #[test]
    fn utc_fields_read_back_as_the_time_they_were_made_of() {
        for epoch_ns in [0, 951_827_696_123_000_000, 1_795_991_400_250_000_000, -86_400_000_000_000]
        {
            assert_eq!(epoch_ns_of_utc_fields(utc_fields(epoch_ns)), Some(epoch_ns));
        }
        assert_eq!(epoch_ns_of_utc_fields([2026, 13, 0, 1, 0, 0, 0, 0]), None);
        assert_eq!(epoch_ns_of_utc_fields([2026, 2, 0, 29, 0, 0, 0, 0]), None, "not a leap year");
        assert_eq!(epoch_ns_of_utc_fields([2026, 11, 0, 29, 24, 0, 0, 0]), None);
    }

    #[test]
    fn clock_offset_applies() {
        let c = Clock::with_offset(1_000_000_000);
        assert_eq!(c.wall_ns(5), 1_000_000_005);
        assert_eq!(c.iso8601(0), "1970-01-01T00:00:01.000000000Z");
    }

    #[test]
    fn live_clock_lies_between_two_realtime_reads() {
        // The clock samples realtime between `before` and `after`, so a conversion of a later
        // monotonic time is at least `before`, and at most `after` plus the error of the
        // midpoint, which is below the whole bracket.
        let before = clock_ns(libc::CLOCK_REALTIME) as i128;
        let c = Clock::new();
        let wall = c.wall_ns(monotonic_ns());
        let after = clock_ns(libc::CLOCK_REALTIME) as i128;
        assert!(before <= wall && wall <= after + (after - before), "{before} {wall} {after}");
    }
}
