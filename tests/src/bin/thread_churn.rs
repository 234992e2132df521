//! A process whose threads come and go on command (stdin lines), each reporting its thread id:
//!
//! * `start` → a thread that runs until told to end → `STARTED <tid>`;
//! * `end <tid>` → that thread ends and is joined → `ENDED <tid>`;
//! * `quick` → a thread that ends at once, joined → `QUICK <tid>`;
//! * `exit` or EOF → the process exits (threads still running end with it).
use std::collections::HashMap;
use std::io::BufRead as _;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// The calling thread's id.
fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn main() {
    println!("READY {}", std::process::id());
    let mut running: HashMap<u32, (mpsc::Sender<()>, JoinHandle<()>)> = HashMap::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["start"] => {
                let (tid_tx, tid_rx) = mpsc::channel();
                let (end_tx, end_rx) = mpsc::channel::<()>();
                let thread = std::thread::spawn(move || {
                    tid_tx.send(gettid()).expect("main thread waits");
                    let _ = end_rx.recv();
                });
                let tid = tid_rx.recv().expect("the thread reports its id");
                running.insert(tid, (end_tx, thread));
                println!("STARTED {tid}");
            }
            ["end", tid] => {
                let tid: u32 = tid.parse().expect("a thread id");
                let (end, thread) = running.remove(&tid).expect("a running thread");
                drop(end);
                thread.join().expect("the thread ends");
                println!("ENDED {tid}");
            }
            ["quick"] => {
                let tid = std::thread::spawn(gettid).join().expect("the thread ends");
                println!("QUICK {tid}");
            }
            ["exit"] => break,
            _ => println!("ERROR unknown command {line:?}"),
        }
    }
}
