//! `user_events_unreg <tracefs> <hex addr> <bit>`: opens user_events_data and issues
//! DIAG_IOCSUNREG for (addr, bit) in this freshly exec'd process; prints `ok` or the errno number.
//! Tests use it to show that exec drops the registrations a process inherited.
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, tracefs, addr, bit] = &args[..] else {
        eprintln!("usage: user_events_unreg <tracefs> <hex addr> <bit>");
        std::process::exit(2);
    };
    let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).expect("hex address");
    let bit: u8 = bit.parse().expect("bit number");
    let fd = tests::user_events::open_data(Path::new(tracefs));
    match tests::user_events::unregister(&fd, addr, bit) {
        Ok(()) => println!("ok"),
        Err(errno) => println!("errno {errno}"),
    }
}
