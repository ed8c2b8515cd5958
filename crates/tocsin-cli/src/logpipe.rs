//! The node's log writer: it never makes the node wait on its log.
//!
//! `tracing_subscriber::fmt` writes each event to its writer on the thread
//! that logged it: a fire loop's "first fire batch" line, a leader's
//! "elected" line, a request's access line. Written straight to stderr,
//! each line waits for whatever stderr is: a file on a disk whose journal
//! is stalled, a pipe nobody reads (a log shipper that stopped), a
//! terminal paused with ^S. One such wait held a failover's first fire
//! for as long as the disk did (chaos-tests/README.md, run 84).
//!
//! So a line goes through a bounded queue to one thread that writes it.
//! When that queue is full the line is dropped and counted
//! (`tocsin_log_lines_dropped_total`), and the writer says how many it
//! dropped with the next line it writes: a lost log line is a smaller
//! harm than a late timer. At exit, [`FlushOnDrop`] waits a bounded time
//! for the queue to drain, so a node that stops says why.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::mpsc::SyncSender;
use std::sync::mpsc::TrySendError;
use std::time::Duration;
use std::time::Instant;

/// Lines the queue holds before it drops: at about 200 bytes a line, a
/// few MiB; room for a burst of warnings while stderr is slow, small
/// enough that a node whose stderr never drains does not grow with it.
pub const QUEUE_LINES: usize = 16_384;

/// How long a stopping node waits for its queued lines to be written.
pub const FLUSH_AT_EXIT: Duration = Duration::from_secs(2);

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line queued before it is written.
    Flush(SyncSender<()>),
}

/// The sending side: a `MakeWriter` for `tracing_subscriber::fmt`.
#[derive(Clone)]
pub struct LogPipe {
    tx: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
}

impl LogPipe {
    /// Starts the writer thread, writing to `out`, with room for
    /// `queue_lines` lines.
    pub fn start<W: Write + Send + 'static>(out: W, queue_lines: usize) -> std::io::Result<LogPipe> {
        let (tx, rx) = std::sync::mpsc::sync_channel(queue_lines.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = dropped.clone();
        std::thread::Builder::new().name("tocsin-log".into()).spawn(move || write_lines(out, rx, &counter))?;
        Ok(LogPipe { tx, dropped })
    }

    /// Queues one formatted event; never waits.
    fn send(&self, line: &[u8]) {
        match self.tx.try_send(Msg::Line(line.to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("tocsin_log_lines_dropped_total").increment(1);
            }
            // The writer thread is gone (it cannot be, short of a panic in
            // a write): nothing left to write with.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Waits up to `limit` for every line queued so far to be written;
    /// returns whether they were.
    pub fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let (ack_tx, ack_rx) = std::sync::mpsc::sync_channel(1);
        let mut msg = Msg::Flush(ack_tx);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    if Instant::now() >= deadline {
                        return false;
                    }
                    msg = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        ack_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_ok()
    }
}

fn write_lines<W: Write>(mut out: W, rx: Receiver<Msg>, dropped: &AtomicU64) {
    loop {
        let msg = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(msg) => msg,
            // Says what was dropped even when nothing else comes.
            Err(RecvTimeoutError::Timeout) => {
                report_dropped(&mut out, dropped);
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        match msg {
            Msg::Line(line) => {
                report_dropped(&mut out, dropped);
                let _ = out.write_all(&line);
            }
            Msg::Flush(ack) => {
                report_dropped(&mut out, dropped);
                let _ = out.flush();
                let _ = ack.try_send(());
            }
        }
    }
}

fn report_dropped<W: Write>(out: &mut W, dropped: &AtomicU64) {
    let n = dropped.swap(0, Ordering::Relaxed);
    if n > 0 {
        let _ = writeln!(
            out,
            "tocsin: {n} log line(s) dropped: the log's output did not keep up, and the node does not wait for it"
        );
    }
}

/// One event's writer; `fmt` formats an event whole, then writes it once.
pub struct LineWriter<'a>(&'a LogPipe);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.send(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogPipe {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter(self)
    }
}

/// Flushes the pipe (at most [`FLUSH_AT_EXIT`]) when dropped: held by a
/// node's command for its whole run, so its last lines get out.
pub struct FlushOnDrop(pub LogPipe);

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        self.0.flush(FLUSH_AT_EXIT);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A writer that blocks until released, then records what it got.
    #[derive(Clone, Default)]
    struct Stuck {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Stuck {
        fn release(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
        fn text(&self) -> String {
            String::from_utf8(self.got.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut open = self.open.0.lock().unwrap();
            while !*open {
                open = self.open.1.wait(open).unwrap();
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_output_drops_lines_instead_of_blocking_and_says_how_many() {
        let out = Stuck::default();
        let pipe = LogPipe::start(out.clone(), 4).unwrap();
        let started = Instant::now();
        for i in 0..100 {
            let mut w = LineWriter(&pipe);
            w.write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        // 100 lines into a queue of 4 behind a writer that does not move:
        // none of them waited.
        assert!(started.elapsed() < Duration::from_secs(1), "logging waited {:?}", started.elapsed());
        assert!(!pipe.flush(Duration::from_millis(100)), "nothing can be flushed while the output is stuck");
        out.release();
        assert!(pipe.flush(Duration::from_secs(5)));
        let text = out.text();
        let written: Vec<&str> = text.lines().filter(|l| l.starts_with("line ")).collect();
        // The first line (taken by the writer before it blocked) and the
        // queue's four got through, in order; the rest were dropped and
        // counted.
        assert!((4..=6).contains(&written.len()), "{text}");
        assert_eq!(written[0], "line 0");
        let dropped: u64 =
            text.lines().filter_map(|l| l.strip_prefix("tocsin: ")?.split_once(' ')?.0.parse::<u64>().ok()).sum();
        assert!(dropped > 0, "no drop report in {text}");
        assert_eq!(dropped + written.len() as u64, 100, "{text}");
    }

    #[test]
    fn lines_keep_their_order_and_flush_waits_for_them() {
        let out = Stuck::default();
        out.release();
        let pipe = LogPipe::start(out.clone(), QUEUE_LINES).unwrap();
        for i in 0..1_000 {
            LineWriter(&pipe).write_all(format!("line {i}\n").as_bytes()).unwrap();
        }
        assert!(pipe.flush(Duration::from_secs(5)));
        let text = out.text();
        let expected: String = (0..1_000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, expected);
    }
}
