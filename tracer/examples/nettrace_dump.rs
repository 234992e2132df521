//! Prints every event of a nettrace file as a JSON line, then the Trace object and the stats on
//! stderr. Usage: nettrace_dump FILE
use std::io::Write as _;

use tracer_decode::nettrace::NettraceParser;

fn main() {
    let path = std::env::args().nth(1).expect("usage: nettrace_dump FILE");
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut parser = NettraceParser::default();
    let mut out = std::io::stdout().lock();
    let mut line = Vec::new();
    let result = parser.feed(&data, |e| {
        line.clear();
        e.output().write_json(&mut line);
        line.push(b'\n');
        out.write_all(&line).unwrap();
    });
    eprintln!("trace: {:?}", parser.trace());
    eprintln!("stats: {:?}, lost by thread: {:?}", parser.stats(), parser.lost_by_thread());
    if let Err(e) = result.and_then(|()| parser.finish()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
